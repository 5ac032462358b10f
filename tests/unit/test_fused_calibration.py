"""Fused calibration (compress `fused_calibration`): every window goes through a block as one batch and each linear
group is compressed in a pre-hook when its input arrives. It must see the same group inputs as the true-sequential
path (one stopped forward per group), write the same model, and run one forward per block instead of several."""

from __future__ import annotations

import json

import pytest
import torch

pytestmark = pytest.mark.usefixtures("one_thread")


def _run(cli, model_dir, text_file, out, method, mode, monkeypatch, extra=()):
    from toolkit.compress import recipe

    real, seen = recipe.compress_linear, []
    monkeypatch.setattr(recipe, "compress_linear",
                        lambda W, H, *a, **k: (seen.append(H.clone()), real(W, H, *a, **k))[1])
    r = cli(["compress", method, "--model", model_dir, "--data", text_file, "--no-rotate", "--nsamples", "4",
             "--seqlen", "32", "--w-bits", "4", "--set", f"fused_calibration={mode}", "--set", "export=dense",
             *extra, "--out", out])
    assert r.exit_code == 0, r.stderr
    monkeypatch.setattr(recipe, "compress_linear", real)
    return seen, json.loads((out / "run.json").read_text())["metrics"]


def _weights(out):
    from safetensors.torch import load_file

    tensors = {}
    for path in sorted((out / "model").glob("*.safetensors")):
        tensors.update(load_file(str(path)))
    return tensors


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("method", ["gptq", "obr"])
def test_fused_equals_one_forward_per_group(cli, tiny_llama_dir, tiny_gpt2_dir, text_file, tmp_path, monkeypatch,
                                            arch, method):
    model_dir = tiny_llama_dir if arch == "llama" else tiny_gpt2_dir
    # float64 solves: fewer float roundings that could flip a weight one grid step and move the later groups' H
    extra = ("--set", "solve_dtype=float64", *(("--sparsity", "0.5") if method == "obr" else ()))
    h_off, m_off = _run(cli, model_dir, text_file, tmp_path / "off", method, "never", monkeypatch, extra)
    h_on, m_on = _run(cli, model_dir, text_file, tmp_path / "on", method, "always", monkeypatch, extra)
    assert (m_off["calibration"], m_on["calibration"]) == ("per-group", "fused")
    assert len(h_on) == len(h_off) > 0
    # the first group sees the block input as it came: the same H up to the batched summation order; later groups see
    # it through the compressed earlier groups, where a float rounding may move a weight one grid step
    assert torch.allclose(h_on[0], h_off[0], rtol=1e-5, atol=1e-7)
    for fused, reference in zip(h_on, h_off):
        assert ((fused - reference).norm() / reference.norm()).item() < 1e-3
    off, on = _weights(tmp_path / "off"), _weights(tmp_path / "on")
    assert off.keys() == on.keys()
    for name in off:
        if off[name].is_floating_point():
            close = torch.isclose(on[name], off[name], rtol=1e-3, atol=1e-5).float().mean().item()
            assert close > 0.99, (name, close)  # a float rounding may move a weight a grid step, not more


def test_fused_runs_one_forward_per_block(tiny_llama_dir, text_file, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from toolkit.compress import recipe
    from toolkit.compress.config import GptqConfig
    from toolkit.core.context import RunContext
    from toolkit.data.text import calibration_windows, load_text
    from toolkit.models.view import view_of

    calls = {"always": 0, "never": 0}
    for mode in calls:
        model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir).eval()
        windows = calibration_windows(AutoTokenizer.from_pretrained(tiny_llama_dir), load_text(str(text_file)), 4,
                                      32, 0)
        config = GptqConfig(model=str(tiny_llama_dir), rotate=False, fused_calibration=mode, export="none")
        handles = [layer.register_forward_pre_hook(lambda *_, m=mode: calls.__setitem__(m, calls[m] + 1))
                   for layer in model.model.layers]
        recipe._compress_all(view_of(model), windows, config, RunContext(out=None, quiet=True))
        for handle in handles:
            handle.remove()
    # block 0 first sees the 4 windows once as they are captured, three times as the pipeline checks that two windows
    # batch as they go alone, and one window as its layout is probed (both blocks are of one kind); then one batched
    # forward per block (also the propagation) against a stopped forward per group and window and a propagation per
    # window
    assert calls["always"] == 4 + 3 + 1 + 2
    assert calls["never"] >= 4 + 3 + 1 + 2 * (4 * 4 + 4)


def test_auto_falls_back_above_the_workspace_limit(cli, tiny_llama_dir, text_file, tmp_path, monkeypatch):
    from toolkit.models import memory

    _, metrics = _run(cli, tiny_llama_dir, text_file, tmp_path / "auto", "gptq", "auto", monkeypatch)
    assert metrics["calibration"] == "fused"
    monkeypatch.setattr(memory, "FUSED_WORKSPACE_LIMIT", 0)
    _, metrics = _run(cli, tiny_llama_dir, text_file, tmp_path / "small", "gptq", "auto", monkeypatch)
    assert metrics["calibration"] == "per-group"
    _, metrics = _run(cli, tiny_llama_dir, text_file, tmp_path / "one", "gptq", "auto", monkeypatch,
                      ("--set", "true_sequential=false"))
    assert metrics["calibration"] == "one-pass"


def test_plan_counts_the_batched_workspace(tiny_llama_dir):
    from toolkit.models.memory import plan_memory

    one = plan_memory(tiny_llama_dir, nsamples=8, seqlen=32)
    batched = plan_memory(tiny_llama_dir, nsamples=8, seqlen=32, batched=True)
    from toolkit.models.memory import batched_workspace

    dims = (32, 64, 4)  # the tiny Llama's hidden, intermediate, heads
    assert one["bytes"]["workspace"] == batched_workspace(1, 32, *dims, 4)
    assert batched["bytes"]["workspace"] == batched_workspace(8, 32, *dims, 4) > 4 * one["bytes"]["workspace"]
    assert batched["peak_bytes"]["cpu"] > one["peak_bytes"]["cpu"]
