"""mergekit YAML -> iclrkit merge: the translation computes byte-equal tensors to the equivalent iclrkit command,
per-model weights follow mergekit's formulas (checked against an independent elementwise reference), and bad
configs end as one line, exit 2, with nothing written."""

from __future__ import annotations

import json
import shlex
import sys

import pytest
import torch

from toolkit.core.errors import BadInputError
from toolkit.merge import mergekit as mk
from toolkit.merge.common import merge_states
from toolkit.merge.config import TiesConfig

pytestmark = pytest.mark.usefixtures("one_thread")


def _variants(base_dir, root, n=2):
    """Fine-tuned stand-ins: the base model plus seeded noise, saved as HF directories."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    dirs = []
    for i in range(n):
        model = AutoModelForCausalLM.from_pretrained(base_dir)
        g = torch.Generator().manual_seed(10 + i)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.02 * torch.randn(p.shape, generator=g))
        out = root / f"ft{i}"
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
        dirs.append(str(out))
    return dirs


def _tensors(run_dir):
    from safetensors.torch import load_file

    return load_file(str(run_dir / "model" / "model.safetensors"))


def _assert_byte_equal(a, b):
    assert set(a) == set(b)
    for name in a:
        assert a[name].dtype == b[name].dtype
        assert a[name].numpy().tobytes() == b[name].numpy().tobytes(), name


def _yaml(path, text):
    path.write_text(text)
    return path


def test_ties_yaml_equals_iclrkit_ties_on_gpt2(cli, tiny_gpt2_dir, tmp_path, monkeypatch):
    ft0, ft1 = _variants(tiny_gpt2_dir, tmp_path)
    config = _yaml(tmp_path / "ties.yml", f"""
models:
  - model: {tiny_gpt2_dir}
  - model: {ft0}
    parameters: {{weight: 0.7, density: 0.4}}
  - model: {ft1}
    parameters: {{weight: 0.7, density: 0.4}}
merge_method: ties
base_model: {tiny_gpt2_dir}
parameters:
  int8_mask: true
""")
    args = ["merge", "mergekit", str(config), "-o", str(tmp_path / "mk"), "--json"]
    monkeypatch.setattr(sys, "argv", ["iclrkit", *args])  # what the card records as the command
    r = cli(args)
    assert r.exit_code == 0, r.stderr
    record = json.loads(r.stdout)
    equivalent = record["metrics"]["equivalent_command"]
    assert equivalent.startswith("iclrkit merge ties") and "--density 0.4" in equivalent
    assert any("int8_mask" in note for note in record["metrics"]["notes"])
    r2 = cli([*shlex.split(equivalent)[1:], "-o", tmp_path / "ic"])
    assert r2.exit_code == 0, r2.stderr
    _assert_byte_equal(_tensors(tmp_path / "mk"), _tensors(tmp_path / "ic"))
    model_dir = tmp_path / "mk" / "model"
    assert (model_dir / "mergekit_config.yml").read_text() == config.read_text()
    card = (model_dir / "README.md").read_text()
    assert f"Command: `iclrkit {shlex.join(args)}`" in card and "merge_method: ties" in card
    # the same YAML through the matching command's --config takes the same path
    r3 = cli(["merge", "ties", "--config", config, "-o", tmp_path / "via-config"])
    assert r3.exit_code == 0, r3.stderr
    _assert_byte_equal(_tensors(tmp_path / "via-config"), _tensors(tmp_path / "ic"))


def test_task_arithmetic_yaml_equals_iclrkit_on_llama(cli, tiny_llama_dir, tmp_path):
    ft0, ft1 = _variants(tiny_llama_dir, tmp_path)
    config = _yaml(tmp_path / "ta.yml", f"""
merge_method: task_arithmetic
base_model: {tiny_llama_dir}
models:
  - model: {ft0}
    parameters: {{weight: 0.5}}
  - model: {ft1}
    parameters: {{weight: 0.5}}
parameters: {{lambda: 0.8}}
""")
    translation = mk.translate(*mk.read(config))
    assert translation.config.scaling == pytest.approx(0.4) and translation.config.weights is None
    r = cli(["merge", "mergekit", config, "-o", tmp_path / "mk"])
    assert r.exit_code == 0, r.stderr
    r2 = cli([*shlex.split(translation.equivalent)[1:], "-o", tmp_path / "ic"])
    assert r2.exit_code == 0, r2.stderr
    _assert_byte_equal(_tensors(tmp_path / "mk"), _tensors(tmp_path / "ic"))


def _states(seed, n=3, shape=(6, 5)):
    g = torch.Generator().manual_seed(seed)
    base = {"w": torch.randn(*shape, generator=g, dtype=torch.float64), "steps": torch.tensor(3)}
    models = [{"w": base["w"] + torch.randn(*shape, generator=g, dtype=torch.float64), "steps": torch.tensor(3)}
              for _ in range(n)]
    return base, models


def _reference_ties(base, models, weights, densities, lam, normalize):
    """mergekit's ties, entry by entry in Python floats: trim to int(d·n) magnitudes, weight, elect the sign of the
    weighted sum (0 counts as +), keep agreeing entries, divide by their summed weights."""
    n = base.numel()
    trimmed = []
    for model, d in zip(models, densities):
        tau = (model - base).reshape(-1).tolist()
        k = int(d * n)
        order = sorted(range(n), key=lambda i: -abs(tau[i]))[:k]
        trimmed.append([tau[i] if i in order else 0.0 for i in range(n)])
    out = []
    for i in range(n):
        column = [w * t[i] for w, t in zip(weights, trimmed)]
        sign = 1 if sum(column) >= 0 else -1
        keep = [(c, w) for c, w in zip(column, weights) if (c > 0) - (c < 0) == sign]
        total = sum(c for c, _ in keep)
        divisor = sum(w for _, w in keep) or 1.0
        out.append(base.reshape(-1)[i].item() + lam * (total / divisor if normalize else total))
    return torch.tensor(out, dtype=torch.float64).view_as(base)


@pytest.mark.parametrize("normalize", [True, False])
def test_weighted_ties_follows_mergekit_formula(normalize):
    base, models = _states(1)
    weights, densities = [0.5, 1.0, 0.25], [0.3, 0.6, 1.0]
    config = TiesConfig(models=["m0", "m1", "m2"], base="b", weights=weights, densities=densities, scaling=0.9,
                        normalize=normalize)
    merged = merge_states(config, models, base)
    expect = _reference_ties(base["w"], [m["w"] for m in models], weights, densities, 0.9, normalize)
    assert torch.allclose(merged["w"], expect, atol=1e-12)
    assert torch.equal(merged["steps"], base["steps"])


def test_weighted_task_arithmetic_and_normalize():
    base, models = _states(2, n=2)
    data = {"merge_method": "task_arithmetic", "base_model": "b", "parameters": {"normalize": True, "lambda": 2.0},
            "models": [{"model": "m0", "parameters": {"weight": 1.0}}, {"model": "m1", "parameters": {"weight": 3.0}}]}
    translation = mk.translate(data)
    assert translation.equivalent is None and translation.config.weights == [0.25, 0.75]
    merged = merge_states(translation.config, models, base)
    expect = base["w"] + 2.0 * (1.0 * (models[0]["w"] - base["w"]) + 3.0 * (models[1]["w"] - base["w"])) / 4.0
    assert torch.allclose(merged["w"], expect, atol=1e-12)


def test_linear_translates_to_average_with_mergekit_weights():
    data = {"merge_method": "linear", "dtype": "bfloat16",
            "models": [{"model": "org/a", "parameters": {"weight": 2}}, {"model": "org/b", "parameters": {"weight": 1}}]}
    translation = mk.translate(data)
    assert translation.config.weights == [2.0, 1.0] and translation.config.dtype == "bfloat16"
    assert translation.equivalent == "iclrkit merge average -m org/a,org/b --weights 2.0,1.0"
    base, models = _states(3, n=2)
    merged = merge_states(translation.config, models, None)
    assert torch.allclose(merged["w"], (2 * models[0]["w"] + models[1]["w"]) / 3, atol=1e-12)


@pytest.mark.parametrize("data, message", [
    ({"merge_method": "nuslerp", "models": []}, "merge_method 'nuslerp' is not supported"),
    ({"merge_method": "slerp", "models": [{"model": "org/a"}]}, "needs a base_model"),
    ({"merge_method": "linear", "tokenizer_source": "union",
      "models": [{"model": "org/a", "parameters": {"weight": 1}}, {"model": "org/b", "parameters": {"weight": 1}}]},
     "tokenizer_source 'union' is not supported"),
    ({"merge_method": "ties", "models": [{"model": "org/a", "parameters": {"weight": 1}}]}, "needs a base_model"),
    ({"merge_method": "linear", "slices": []}, "slices"),
    ({"merge_method": "ties", "base_model": "org/b",
      "models": [{"model": "org/a", "parameters": {"weight": {"filter": "mlp", "value": 1}}}]},
     "not a number or a gradient"),
    ({"merge_method": "linear", "models": [{"model": "org/a"}, {"model": "org/b"}]}, "no 'weight'"),
    ({"merge_method": "linear", "models": [{"model": "/nowhere/a", "parameters": {"weight": 1}},
                                           {"model": "org/b", "parameters": {"weight": 1}}]}, "model not found"),
])
def test_bad_configs_are_named(data, message):
    with pytest.raises(BadInputError, match=message):
        mk.translate(data)


def test_bad_yaml_exits_2_with_one_line_and_writes_nothing(cli, tmp_path, tiny_gpt2_dir):
    slerp = _yaml(tmp_path / "slerp.yml", f"merge_method: slerp\nmodels:\n  - model: {tiny_gpt2_dir}\n")
    missing = _yaml(tmp_path / "missing.yml", f"merge_method: ties\nbase_model: {tiny_gpt2_dir}\nmodels:\n"
                                               f"  - model: {tmp_path}/nope\n    parameters: {{weight: 1}}\n")
    for config, words in ((slerp, "slerp"), (missing, "model not found")):
        out = tmp_path / f"out-{config.stem}"
        r = cli(["merge", "mergekit", config, "-o", out])
        assert r.exit_code == 2 and words in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert not out.exists() and not out.with_name(out.name + ".partial").exists()
    wrong = _yaml(tmp_path / "lin.yml", f"merge_method: linear\nmodels:\n  - model: {tiny_gpt2_dir}\n"
                                         f"    parameters: {{weight: 1}}\n  - model: {tiny_gpt2_dir}\n"
                                         f"    parameters: {{weight: 1}}\n")
    r = cli(["merge", "ties", "--config", wrong, "-o", tmp_path / "o"])
    assert r.exit_code == 2 and "merge mergekit" in r.stderr
