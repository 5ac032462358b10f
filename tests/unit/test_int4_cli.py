"""`compress bench` end to end (GEMMs + a packed model) and its bad-input exits, through a Typer app that holds
only `compress bench` (cli.compress_bench.register, which cli/compress.py calls too)."""

import json

import pytest
import torch
import typer
from typer.testing import CliRunner

from cli.compress_bench import register


@pytest.fixture()
def run_bench():
    app = typer.Typer()
    register(app)
    runner = CliRunner()
    return lambda args: runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture()
def packed_dir(tiny_llama_dir, tmp_path):
    """A 2:4 INT4 packed model written by toolkit.compress.packed from the tiny llama (RTN codes, per-row scales)."""
    from toolkit.compress.packed import save_packed
    from toolkit.models.source import load_model
    from toolkit.models.view import view_of

    model, tokenizer = load_model(str(tiny_llama_dir), "cpu", torch.float32)
    view = view_of(model)
    scales = {}
    for i, layer in enumerate(view.blocks):
        for name, module in layer.named_modules():
            if isinstance(module, torch.nn.Linear):
                weight = module.weight.data.float()
                groups = weight.reshape(weight.shape[0], -1, 4)
                keep = groups.abs().argsort(-1)[..., 2:]
                pruned = torch.zeros_like(groups).scatter(-1, keep, groups.gather(-1, keep)).reshape(weight.shape)
                scale = pruned.abs().amax(1).clamp_min(1e-8) / 7
                codes = torch.clamp(torch.round(pruned / scale[:, None]), -8, 7)
                module.weight.data.copy_(codes * scale[:, None])
                scales[f"model.layers.{i}.{name}"] = scale
    save_packed(view, tokenizer, tmp_path / "run" / "packed", scales, 4, {})
    return tmp_path / "run"


def test_bench_end_to_end_with_packed_model(run_bench, packed_dir, tmp_path):
    out = tmp_path / "bench"
    result = run_bench(["--model", packed_dir, "--n", 40, "--k", 200, "--rows", 1, "--rows", 3, "--repeats", 1,
                        "--new-tokens", 2, "--out", out, "--json"])
    assert result.exit_code == 0, result.stdout + result.stderr
    data = json.loads((out / "results.json").read_text())
    assert {(r["kernel"], r["m"]) for r in data["rows"]} == {(k, m) for k in ("int4_dense", "int4_sparse24")
                                                             for m in (1, 3)}
    assert all(r["ms"] > 0 and r["fp32_ms"] > 0 for r in data["rows"])
    model = data["model"]
    assert model["linears"] > 0 and model["linears_24"] == model["linears"]
    assert model["packed_mb"] < model["fp32_mb"]
    assert model["max_abs_logit_gap_vs_fp32"] < 0.5  # only the A8 activation rounding separates the two
    assert (out / "run.json").is_file()


def test_bench_bad_inputs_exit_2(run_bench, tmp_path):
    missing = run_bench(["--model", tmp_path / "nope", "--out", tmp_path / "a"])
    assert missing.exit_code == 2 and "model path not found" in (missing.stdout + missing.stderr)
    bad_rows = run_bench(["--rows", 0, "--out", tmp_path / "b"])
    assert bad_rows.exit_code == 2
    bad_bits = run_bench(["--a-bits", 9, "--out", tmp_path / "c"])
    assert bad_bits.exit_code == 2
