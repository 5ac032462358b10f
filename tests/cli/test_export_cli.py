"""`iclrkit export compressed-tensors|gguf RUN_DIR`, compress's `--set export=...`, `--model packed/`, and the bad
input around them (missing/corrupt packed tensors, Conv1D, W4A4): one line and exit 2, nothing half-written."""

import json

import pytest
import torch

pytestmark = pytest.mark.usefixtures("one_thread")
SMALL = ["--nsamples", "2", "--seqlen", "32", "--set", "eval_windows=1", "--set", "eval_max_length=32"]


def _as_typed(cli, args):
    """Run in-process with sys.argv as a user would have typed it (the cards record the real command)."""
    import sys

    saved = sys.argv
    sys.argv = ["iclrkit", *map(str, args)]
    try:
        return cli(args)
    finally:
        sys.argv = saved


def _compress(cli, model_dir, text_file, out, *extra):
    r = _as_typed(cli, ["compress", "rtn", "--model", model_dir, "--data", text_file, "--w-bits", "4", "--a-bits",
                        "16", "--kv-bits", "16", "--sparsity", "0.5", *SMALL, *extra, "--out", out])
    assert r.exit_code == 0, r.stderr
    return out


@pytest.fixture()
def w4_run(cli, tiny_llama_dir, text_file, tmp_path):
    return _compress(cli, tiny_llama_dir, text_file, tmp_path / "run")


def _logits(model, vocab=300):
    ids = torch.randint(0, vocab, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        return model(ids).logits


def test_export_compressed_tensors_from_a_run(cli, w4_run, tmp_path):
    pytest.importorskip("compressed_tensors", reason="compressed-tensors is not installed")
    from transformers import AutoModelForCausalLM

    from toolkit.compress.packed import load_packed

    out = tmp_path / "ct"
    r = _as_typed(cli, ["export", "compressed-tensors", w4_run, "--out", out, "--json"])
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["metrics"]["format"] == "compressed-tensors"
    packed, _ = load_packed(w4_run / "packed", with_tokenizer=False)
    reloaded = AutoModelForCausalLM.from_pretrained(out).eval()
    reference = _logits(packed)
    assert float((_logits(reloaded) - reference).abs().max() / reference.abs().max()) <= 1e-5
    card = (out / "README.md").read_text()
    assert "iclrkit export compressed-tensors" in card and "iclrkit compress rtn" in card  # export + compress
    assert "Calibration data:" in card and "text.txt" in card and "vllm serve" in card


def test_export_gguf_from_a_run_and_model_accepts_packed(cli, w4_run, tmp_path, text_file):
    out = tmp_path / "gg"
    r = cli(["export", "gguf", w4_run / "packed", "--out", out])
    assert r.exit_code == 0, r.stderr
    assert (out / "model-Q4_0.gguf").stat().st_size > 0 and "llama-cli" in (out / "README.md").read_text()
    r = cli(["eval", "ppl", "--model", w4_run / "packed", "--data", text_file, "--max-length", "32",
             "--max-windows", "2", "--json"])
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["metrics"]["ppl"] > 1


def test_compress_writes_compressed_tensors_and_packed(cli, tiny_llama_dir, text_file, tmp_path):
    pytest.importorskip("compressed_tensors", reason="compressed-tensors is not installed")
    out = _compress(cli, tiny_llama_dir, text_file, tmp_path / "run", "--set", "export=compressed-tensors")
    assert (out / "packed" / "model.packed.safetensors").exists()
    config = json.loads((out / "compressed-tensors" / "config.json").read_text())
    assert config["quantization_config"]["format"] == "pack-quantized"
    ct_card = (out / "compressed-tensors" / "README.md").read_text()
    assert "iclrkit compress rtn" in ct_card
    # the card names where the model is once the run is done, not the OUT.partial folder it was written in
    assert f'from_pretrained("{out / "compressed-tensors"}")' in ct_card and ".partial" not in ct_card
    packed_card = (out / "packed" / "README.md").read_text()
    assert "iclrkit compress rtn" in packed_card and "Calibration data: " in packed_card
    assert "stay in this format" in packed_card


def test_dense_export_card_says_what_and_how(cli, tiny_llama_dir, text_file, tmp_path):
    out = _compress(cli, tiny_llama_dir, text_file, tmp_path / "run", "--set", "export=dense")
    card = (out / "model" / "README.md").read_text()
    assert "iclrkit compress rtn" in card and "Sparsity: 0.5" in card and "Calibration data: " in card
    assert "from_pretrained" in card and "vllm serve" in card


def test_w4a4_run_is_refused_and_nothing_is_written(cli, tiny_llama_dir, text_file, tmp_path):
    run = tmp_path / "run"
    r = cli(["compress", "rtn", "--model", tiny_llama_dir, "--data", text_file, "--a-bits", "4", *SMALL,
             "--set", "export=packed", "--out", run])
    assert r.exit_code == 0, r.stderr
    for fmt in ("compressed-tensors", "gguf"):
        r = cli(["export", fmt, run, "--out", tmp_path / fmt])
        assert r.exit_code == 2 and "packed format" in r.stderr and len(r.stderr.strip().splitlines()) == 1
        assert not (tmp_path / fmt).exists()


def test_gpt2_conv1d_to_compressed_tensors_exits_2(cli, tiny_gpt2_dir, text_file, tmp_path):
    run = _compress(cli, tiny_gpt2_dir, text_file, tmp_path / "run", "--set", "export=packed")
    r = cli(["export", "compressed-tensors", run, "--out", tmp_path / "ct"])
    assert r.exit_code == 2 and "not supported by the compressed-tensors format" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "ct").exists()


def _rewrite_packed(src, dst, drop: str | None = None, damage: str | None = None):
    import shutil

    from safetensors import safe_open
    from safetensors.numpy import save_file

    shutil.copytree(src, dst)
    path = dst / "model.packed.safetensors"
    with safe_open(str(path), framework="numpy") as handle:
        metadata = handle.metadata()
        tensors = {k: handle.get_tensor(k) for k in handle.keys()}  # noqa: SIM118 - safe_open is not a dict
    if drop:
        tensors.pop(drop)
    if damage:
        tensors[damage] = tensors[damage][: tensors[damage].size // 2]
    save_file(tensors, str(path), metadata=metadata)
    return dst


@pytest.mark.parametrize("case", ["missing", "truncated-tensor", "corrupt-file"])
def test_bad_packed_dir_is_one_line_exit_2(cli, w4_run, tmp_path, text_file, case):
    name = "model.layers.0.self_attn.q_proj"
    if case == "missing":
        bad = _rewrite_packed(w4_run / "packed", tmp_path / "bad", drop=f"{name}.qweight")
    elif case == "truncated-tensor":
        bad = _rewrite_packed(w4_run / "packed", tmp_path / "bad", damage=f"{name}.qweight")
    else:
        bad = _rewrite_packed(w4_run / "packed", tmp_path / "bad")
        data = (bad / "model.packed.safetensors").read_bytes()
        (bad / "model.packed.safetensors").write_bytes(data[: len(data) // 2])
    for args in (["eval", "ppl", "--model", bad, "--data", text_file, "--max-length", "32"],
                 ["export", "gguf", bad, "--out", tmp_path / "gg"]):
        r = cli(args)
        assert r.exit_code == 2, (case, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error:"), r.stderr
        assert "model.packed.safetensors" in lines[0] or name in lines[0]
    assert not (tmp_path / "gg").exists()


def test_packed_model_keeps_its_activation_and_kv_quantization(tiny_llama_dir, tmp_path, text_file, cli):
    from toolkit.compress.packed import load_packed
    from toolkit.export.quantized import quant_hooks
    from toolkit.models.source import load_model
    from toolkit.models.view import view_of

    run = tmp_path / "run"
    r = cli(["compress", "rtn", "--model", tiny_llama_dir, "--data", text_file, "--a-bits", "4", "--kv-bits", "4",
             *SMALL, "--set", "export=packed", "--out", run])
    assert r.exit_code == 0, r.stderr
    model, tokenizer = load_model(str(run / "packed"))
    assert tokenizer is not None and hasattr(model, "iclrkit_quant_hooks")
    plain, _ = load_packed(run / "packed", with_tokenizer=False)
    config = json.loads((run / "packed" / "quantization_config.json").read_text())
    with quant_hooks(view_of(plain), config):
        expected = _logits(plain)
    assert torch.allclose(_logits(model), expected, atol=1e-6)
    assert not torch.allclose(_logits(plain), expected, atol=1e-3)  # the hooks change the model
