"""`iclrkit compress ...` end to end on tiny models: outputs, reloads, --dry-run, --resume and bad input."""

import json

import pytest
import torch

SMALL = ["--nsamples", "4", "--seqlen", "32", "--set", "eval_windows=2", "--set", "eval_max_length=32"]


def test_obr_end_to_end_on_tiny_llama(cli, tiny_llama_dir, text_file, tmp_path, device_args):
    out = tmp_path / "obr"
    r = cli(["compress", "obr", "--model", tiny_llama_dir, "--data", text_file, "--eval-data", text_file,
             *SMALL, *device_args, "--out", out, "--json"])
    assert r.exit_code == 0, r.stderr
    record = json.loads(r.stdout)
    metrics = record["metrics"]
    assert metrics["rotated"] is True and metrics["ppl"] > 1 and 0.45 < metrics["sparsity"] < 0.6
    assert record["config"]["alpha"] == 0.5 and record["config"]["a_bits"] == 4
    # QuaRot-faithful defaults: KV4 symmetric per token over all heads; exact Hadamards (hidden 32, intermediate 64,
    # 4 heads); with a_bits < 16 the online cross-head Hadamard before o_proj
    assert record["config"]["kv_quant"] == "token-sym"
    assert metrics["hadamard"] == {"residual": "exact", "head": "exact", "down_proj": "exact", "o_proj": "exact"}
    stored = json.loads((out / "packed" / "quantization_config.json").read_text())
    assert stored["kv_quant"] == "token-sym" and stored["rotation"]["online_o_proj"]["heads"] == 4
    from transformers import AutoModelForCausalLM

    from toolkit.compress.packed import load_packed

    dense = AutoModelForCausalLM.from_pretrained(out / "model").eval()
    packed, _ = load_packed(out / "packed")
    # every quantized linear of the dense export is exactly the packed one (down_proj: with the online rotation
    # folded in, computed as fold_online_rotations does)
    linears = json.loads((out / "packed" / "quantization_config.json").read_text())["linears"]
    assert len(linears) == 14
    for path in linears:
        stored = packed.get_submodule(path)
        expected = stored.weight
        if hasattr(stored, "iclrkit_online_rotation"):
            expected = (expected.double() @ stored.iclrkit_online_rotation.matrix().t()).to(expected.dtype)
        assert torch.equal(dense.get_submodule(path).weight, expected), path
    ids = torch.randint(0, 300, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        reference = dense(ids).logits
        # only the float16 storage of the other tensors separates the two: far below the logits' own spread
        assert (reference - packed(ids).logits).abs().max() < 1e-2 * reference.std()
    assert (out / "run.json").exists() and (out / "config.resolved.yaml").exists()
    assert not (out / "checkpoints").exists()


def test_sparsegpt_two_four_on_gpt2(cli, tiny_gpt2_dir, text_file, tmp_path):
    out = tmp_path / "sgpt"
    r = cli(["compress", "sparsegpt", "--model", tiny_gpt2_dir, "--data", text_file, "--nm", "2:4", *SMALL,
             "--set", "export=packed", "--out", out, "--json"])
    assert r.exit_code == 0, r.stderr
    from toolkit.compress.packed import load_packed

    model, _ = load_packed(out / "packed")
    weight = model.transformer.h[0].mlp.c_fc.weight.t()  # Conv1D stores (in, out)
    assert ((weight != 0).reshape(weight.shape[0], -1, 4).sum(dim=2) <= 2).all()


def test_dry_run_prints_the_plan_and_writes_nothing(cli, tiny_llama_dir, tmp_path):
    out = tmp_path / "dry"
    r = cli(["compress", "wanda", "--model", tiny_llama_dir, "--out", out, "--dry-run"])
    assert r.exit_code == 0, r.stderr
    plan = json.loads(r.stdout)["plan"]
    assert plan["blocks"] == 2 and plan["rotate"] is True
    assert plan["sequential_groups"][0] == ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"]
    assert plan["linears_per_block"][-1]["hessian"] == [64, 64] and plan["memory_estimate_mb"] > 0
    assert not out.exists()


def test_resume_continues_after_the_last_finished_block(cli, tiny_llama_dir, text_file, tmp_path, monkeypatch):
    from toolkit.compress import recipe

    real, calls = recipe.compress_linear, []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 5:  # first group of block 1: block 0 (4 sequential groups, one GPTQ each) is checkpointed
            raise RuntimeError("killed")
        return real(*args, **kwargs)

    out = tmp_path / "resume"
    args = ["compress", "gptq", "--model", tiny_llama_dir, "--data", text_file, *SMALL, "--set", "export=none",
            "--out", out]
    monkeypatch.setattr(recipe, "compress_linear", failing)
    assert cli(args).exit_code == 1
    assert (tmp_path / "resume.partial" / "checkpoints" / "progress.json").exists() and not out.exists()
    calls.clear()
    r = cli([*args, "--resume"])
    assert r.exit_code == 0, r.stderr
    assert len(calls) == 4  # only block 1 was recomputed


@pytest.mark.parametrize("extra,message", [
    (["--sparsity", "1.0"], "sparsity"),
    (["--w-bits", "9"], "bits"),
    (["--a-bits", "1"], "bits"),
    (["--kv-quant", "per-channel"], "kv_quant"),
    (["--nm", "4:4"], "N < M"),
    (["--set", "alpha=1.5"], "alpha"),
    (["--data", "SHORT"], "shorter than one window"),
    (["--rotate"], "rotation is not exact for gpt2"),
    (["--data", "/nonexistent/text.txt"], "not found"),
])
def test_bad_input_exits_2_and_writes_nothing(cli, tiny_gpt2_dir, text_file, tmp_path, extra, message):
    out = tmp_path / "bad"
    short = tmp_path / "short.txt"
    short.write_text("too short")
    extra = [str(short) if item == "SHORT" else item for item in extra]
    r = cli(["compress", "obr", "--model", tiny_gpt2_dir, "--data", text_file, "--nsamples", "2", "--seqlen", "16",
             "--out", out, *extra])  # later flags win
    assert r.exit_code == 2, r.stderr
    assert message in r.stderr
    assert not out.exists() and not (tmp_path / "bad.partial").exists()


def test_two_stage_with_grouped_activation_ordered_scales_round_trips(cli, tiny_llama_dir, text_file, tmp_path):
    out = tmp_path / "two-stage"
    r = cli(["compress", "sparsegpt-gptq", "--model", tiny_llama_dir, "--data", text_file, "--group-size", "16",
             "--actorder", "group", *SMALL, "--set", "export=packed", "--out", out, "--json"])
    assert r.exit_code == 0, r.stderr
    record = json.loads(r.stdout)
    assert record["config"]["actorder"] == "group" and 0.45 < record["metrics"]["sparsity"] < 0.6
    from safetensors import safe_open

    with safe_open(str(out / "packed" / "model.packed.safetensors"), framework="pt") as handle:
        scales = handle.get_tensor("model.layers.0.self_attn.q_proj.scales")
        g_idx = handle.get_tensor("model.layers.0.self_attn.q_proj.g_idx")
    assert scales.shape == (32, 2) and sorted(torch.bincount(g_idx).tolist()) == [16, 16]


def test_bfloat16_run_solves_in_float32_and_writes_bfloat16(cli, tiny_llama_dir, text_file, tmp_path, monkeypatch):
    from toolkit.compress import recipe

    real, seen = recipe.compress_linear, []

    def recording(W, H, *args, **kwargs):
        seen.append((W.dtype, H.dtype))
        return real(W, H, *args, **kwargs)

    monkeypatch.setattr(recipe, "compress_linear", recording)
    out = tmp_path / "bf16"
    r = cli(["compress", "gptq", "--model", tiny_llama_dir, "--data", text_file, "--dtype", "bfloat16",
             "--eval-data", text_file, *SMALL, "--out", out, "--json"])
    assert r.exit_code == 0, r.stderr
    assert len(seen) == 8 and set(seen) == {(torch.float32, torch.float32)}  # one GPTQ per group and block
    metrics = json.loads(r.stdout)["metrics"]
    assert metrics["ppl"] > 1 and metrics["actorder"] == "none"  # actorder=auto on a rotated model
    from transformers import AutoModelForCausalLM

    from toolkit.compress.packed import load_packed

    dense = AutoModelForCausalLM.from_pretrained(out / "model", dtype="auto")
    assert dense.model.layers[0].self_attn.q_proj.weight.dtype == torch.bfloat16
    packed, _ = load_packed(out / "packed", dtype=torch.bfloat16, with_tokenizer=False)
    for name in ("self_attn.q_proj", "self_attn.o_proj", "mlp.up_proj"):
        path = f"model.layers.1.{name}"
        assert torch.equal(packed.get_submodule(path).weight, dense.get_submodule(path).weight), path


@pytest.mark.parametrize("extra,message", [
    (["--actorder", "group"], "group-size"),
    (["--actorder", "sideways"], "actorder"),
    (["--group-size", "0"], "group_size"),
])
def test_bad_ordering_and_group_flags_exit_2(cli, tiny_llama_dir, text_file, tmp_path, extra, message):
    out = tmp_path / "bad"
    r = cli(["compress", "gptq", "--model", tiny_llama_dir, "--data", text_file, "--nsamples", "2", "--seqlen", "16",
             "--out", out, *extra])
    assert r.exit_code == 2, r.stderr
    assert message in r.stderr
    assert not out.exists()


@pytest.mark.parametrize("true_sequential", [True, False])
def test_one_pass_calibration_sees_the_uncompressed_block(cli, tiny_llama_dir, text_file, tmp_path, monkeypatch,
                                                          true_sequential):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from toolkit.compress import recipe
    from toolkit.data.text import calibration_windows, load_text
    from toolkit.linalg.hessian import HessianAccumulator

    real, seen = recipe.compress_linear, []
    monkeypatch.setattr(recipe, "compress_linear", lambda W, H, *a, **k: (seen.append(H.clone()), real(W, H, *a,
                                                                                                        **k))[1])
    r = cli(["compress", "gptq", "--model", tiny_llama_dir, "--data", text_file, "--no-rotate", "--nsamples", "4",
             "--seqlen", "32", "--set", f"true_sequential={str(true_sequential).lower()}", "--set", "export=none",
             "--out", tmp_path / "run"])
    assert r.exit_code == 0, r.stderr
    # block 0's down_proj H from the original (uncompressed) model on the same windows
    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir).eval()
    windows = calibration_windows(AutoTokenizer.from_pretrained(tiny_llama_dir), load_text(str(text_file)), 4, 32, 0)
    accumulator = HessianAccumulator(64, dtype=torch.float32)
    handle = model.model.layers[0].mlp.down_proj.register_forward_hook(accumulator.hook())
    with torch.no_grad():
        for window in windows:
            model(window.unsqueeze(0))
    handle.remove()
    down = seen[3]  # groups [q,k,v] [o] [gate,up] [down]: one GPTQ each
    assert torch.allclose(down, accumulator.H, rtol=1e-4, atol=1e-6) != true_sequential
