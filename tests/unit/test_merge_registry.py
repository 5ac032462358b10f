"""Merge methods live on the core registry (kind "merge"): a method registered here, in the test, runs through the
same path as the built-in ones (in memory and streamed), and the CLI / mergekit pick methods by registered name."""

from __future__ import annotations

import json
from typing import Literal

import pytest
import torch
from safetensors.torch import load_file

from toolkit.core.context import RunContext
from toolkit.core.errors import BadInputError
from toolkit.core.registry import register, registry
from toolkit.merge import common
from toolkit.merge.config import AverageConfig, MergeOptions
from toolkit.merge.weightspace import run_weightspace

pytestmark = pytest.mark.usefixtures("one_thread")


class MaxConfig(AverageConfig):
    method: Literal["test-max"] = "test-max"


@pytest.fixture
def max_method():
    """A trivial method, registered only for this test: the elementwise maximum of the models' tensors."""
    calls = []

    def elementwise_max(tensors, base, options, dtype=None):
        calls.append(tuple(tensors[0].shape))
        if not tensors[0].is_floating_point():
            return tensors[0].clone()
        return torch.stack(tensors).amax(0).to(dtype or tensors[0].dtype)

    register("merge", "test-max", config=MaxConfig, tensorwise=True, needs_base=False, rowwise=True,
             record=("weights",), flags=["models"], help="Elementwise max (test only).")(elementwise_max)
    yield calls
    registry("merge")._entries.pop("test-max")


def _pair(root):
    import transformers

    config = transformers.GPT2Config(n_embd=16, n_layer=1, n_head=2, n_positions=16, vocab_size=40,
                                     bos_token_id=0, eos_token_id=0)
    dirs = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        path = root / f"m{seed}"
        transformers.GPT2LMHeadModel(config).save_pretrained(path)
        dirs.append(str(path))
    return dirs


def _reference(specs):
    """The elementwise max computed straight from the saved files (independent of the merge code)."""
    a, b = (load_file(f"{spec}/model.safetensors") for spec in specs)
    return {n: torch.maximum(a[n], b[n]) if a[n].is_floating_point() else a[n] for n in a}


@pytest.mark.parametrize("stream", [True, False])
def test_a_method_registered_in_the_test_runs_through_the_registry(max_method, stream, tmp_path, monkeypatch):
    monkeypatch.setattr(common, "STREAM_CHUNK", 64)  # streamed: row chunks of every matrix (rowwise=True)
    specs = _pair(tmp_path)
    ctx = RunContext(out=tmp_path / "run", quiet=True)
    run_weightspace(MaxConfig(models=specs, stream=stream), ctx)
    out = tmp_path / "run" / "model"
    written = {n: t for shard in sorted(out.glob("*.safetensors")) for n, t in load_file(str(shard)).items()}
    expected = _reference(specs)
    assert written and set(written) <= set(expected)
    for name, tensor in written.items():
        assert torch.equal(tensor, expected[name]), name
    assert json.loads((out / "config.json").read_text())["iclrkit"]["technique"] == "merge.test-max"
    assert ctx.metrics["n_models"] == 2 and bool(ctx.metrics.get("streamed")) is stream
    if stream:  # the 16x48 attention matrix came in row chunks of at most 64 elements
        assert (1, 48) in max_method


def test_merge_states_picks_the_method_by_name(max_method):
    states = [{"w": torch.tensor([1.0, -2.0, 3.0])}, {"w": torch.tensor([0.0, 5.0, -1.0])}]
    merged = common.merge_states("test-max", states, None, MergeOptions())
    assert merged["w"].tolist() == [1.0, 5.0, 3.0]
    averaged = common.merge_states("average", states, None, MergeOptions(weights=[3.0, 1.0]))
    assert torch.allclose(averaged["w"], torch.tensor([0.75, -0.25, 2.0]))


def test_unknown_and_whole_model_methods_are_one_clear_error():
    states = [{"w": torch.zeros(2)}, {"w": torch.ones(2)}]
    with pytest.raises(BadInputError, match="unknown merge method 'nope'") as info:
        common.merge_states("nope", states, None, MergeOptions())
    assert "average" in info.value.one_line() and "ties" in info.value.one_line()
    with pytest.raises(BadInputError, match="does not merge tensor by tensor"):
        common.merge_states("latent", states, None, MergeOptions())
    with pytest.raises(BadInputError, match="needs a base model"):
        common.merge_states("ties", states, None, MergeOptions())


def test_cli_has_one_command_per_registered_method_and_mergekit_maps_onto_them():
    import typer

    from cli.main import app
    from toolkit.merge import mergekit

    merge = typer.main.get_command(app).commands["merge"]
    commands = {name: set(getattr(cmd, "commands", {}) or {}) for name, cmd in merge.commands.items()}
    for method in registry("merge"):
        group = method.meta.get("group")
        name = method.meta.get("command", method.name)
        assert (name in commands[group]) if group else (name in commands), method.name
    assert {m: mergekit.technique_of(m) for m in mergekit.SUPPORTED} == {
        "linear": "merge.average", "task_arithmetic": "merge.task-arithmetic", "ties": "merge.ties"}
