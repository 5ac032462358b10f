"""`iclrkit export gguf RUN` and `compress --set export=gguf` refuse an architecture llama.cpp cannot serve from the
model's config.json, before the model is loaded: one line, exit 2, nothing written."""

import pytest

pytestmark = pytest.mark.usefixtures("one_thread")
SMALL = ["--nsamples", "2", "--seqlen", "16", "--set", "eval_windows=1", "--set", "eval_max_length=32"]


def _tiny(arch, tmp_path, tokenizer, **overrides):
    import torch

    from toolkit.models.tiny import build_tiny

    torch.manual_seed(0)
    model = build_tiny(arch, len(tokenizer))
    for key, value in overrides.items():
        setattr(model.config, key, value)
    path = tmp_path / arch
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_export_gguf_refuses_opt_before_loading_the_packed_model(cli, tmp_path, text_file, tiny_tokenizer,
                                                                 monkeypatch):
    import toolkit.export.quantized as quantized

    run = tmp_path / "run"
    r = cli(["compress", "rtn", "--model", _tiny("opt", tmp_path, tiny_tokenizer), "--data", text_file,
             "--w-bits", "4", *SMALL, "--set", "export=packed", "--out", run])
    assert r.exit_code == 0, r.stderr

    def never(*args, **kwargs):
        raise AssertionError("the packed model was loaded before the architecture was checked")

    monkeypatch.setattr(quantized, "from_packed", never)
    r = cli(["export", "gguf", run, "--out", tmp_path / "gg"])
    assert r.exit_code == 2 and "llama.cpp has no loader for opt" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "gg").exists()


def test_compress_export_gguf_refuses_a_convention_llama_cpp_hard_codes(cli, tmp_path, text_file, tiny_tokenizer,
                                                                        monkeypatch):
    """Qwen2-MoE with renormalised top-k weights: llama.cpp's qwen2moe never renormalises; refused from
    config.json before the model loads (compress's loader is never called)."""
    import toolkit.models.source as source

    model = _tiny("qwen2_moe", tmp_path, tiny_tokenizer, norm_topk_prob=True)

    def never(*args, **kwargs):
        raise AssertionError("the model was loaded before the export was checked")

    monkeypatch.setattr(source, "load_model", never)
    out = tmp_path / "run"
    r = cli(["compress", "rtn", "--model", model, "--data", text_file, "--w-bits", "4", *SMALL,
             "--set", "export=gguf", "--out", out])
    assert r.exit_code == 2 and "never renormalises the top-k routing weights" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not out.exists()
