"""Merge methods live on the core registry (kind "merge"): one file in toolkit/merge/methods/ (or any module that
registers) is a method. A throw-away method registered from a temporary module gets a CLI command with its knob as
a flag, --config, --dry-run and run.json, and runs through the same tensor call in memory and streamed."""

from __future__ import annotations

import inspect
import json
import pkgutil

import pytest
import torch
from safetensors.torch import load_file
from testkit import throwaway_method

from toolkit.core.errors import BadInputError
from toolkit.core.registry import registry
from toolkit.merge import common
from toolkit.merge.config import AverageConfig, TaskArithmeticConfig, TiesConfig

pytestmark = pytest.mark.usefixtures("one_thread")

THROWAWAY = '''
from typing import Literal

from pydantic import Field

from toolkit.core.registry import register
from toolkit.merge.config import TensorMergeConfig


class MaxConfig(TensorMergeConfig):
    method: Literal["test-max"] = "test-max"
    shift: float = Field(0.0, description="Added to the elementwise maximum.")


@register("merge", "test-max", config=MaxConfig, tensorwise=True, needs_base=False, rowwise=True,
          record=("shift",), flags=["models", "shift"], help="Elementwise max plus a shift (test only).")
def elementwise_max(tensors, base, config, site):
    import torch

    CALLS.append((site.name, tuple(tensors[0].shape), tensors[0].dtype))
    return torch.stack(tensors).amax(0) + config.shift


CALLS = []
'''


@pytest.fixture
def max_method(tmp_path):
    with throwaway_method(tmp_path / "mod", "merge", THROWAWAY, "cli.merge") as module:
        yield module


@pytest.fixture
def pair(tmp_path):
    import transformers

    config = transformers.GPT2Config(n_embd=16, n_layer=2, n_head=2, n_positions=16, vocab_size=40,
                                     bos_token_id=0, eos_token_id=0)
    dirs = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        path = tmp_path / f"m{seed}"
        transformers.GPT2LMHeadModel(config).save_pretrained(path)
        dirs.append(str(path))
    return dirs


def _reference(specs, shift):
    """The elementwise max computed straight from the saved files (independent of the merge code)."""
    a, b = (load_file(f"{spec}/model.safetensors") for spec in specs)
    return {n: torch.maximum(a[n], b[n]) + shift if a[n].is_floating_point() else a[n] for n in a}


def _written(out):
    return {n: t for shard in sorted(out.glob("*.safetensors")) for n, t in load_file(str(shard)).items()}


@pytest.fixture(autouse=True)
def _mod_dir(tmp_path):
    (tmp_path / "mod").mkdir()


@pytest.mark.parametrize("stream", [True, False])
def test_a_throwaway_method_gets_cli_config_dry_run_and_run_json(max_method, pair, stream, cli, tmp_path,
                                                                 monkeypatch):
    monkeypatch.setattr(common, "STREAM_CHUNK", 64)  # streamed: row chunks of every matrix (rowwise=True)
    config = tmp_path / "max.yaml"
    config.write_text(f"stream: {str(stream).lower()}\n")
    out = tmp_path / "run"
    r = cli(["merge", "test-max", "-m", ",".join(pair), "--shift", "0.25", "--config", config, "-o", out])
    assert r.exit_code == 0, r.stderr
    record = json.loads((out / "run.json").read_text())
    assert record["technique"] == "merge.test-max"
    assert record["config"]["shift"] == 0.25 and record["config"]["stream"] is stream
    written, expected = _written(out / "model"), _reference(pair, 0.25)
    assert written and set(written) <= set(expected)
    for name, tensor in written.items():
        assert torch.equal(tensor, expected[name]), name
    assert json.loads((out / "model" / "config.json").read_text())["iclrkit"]["shift"] == 0.25
    if stream:  # the 16x48 attention matrix came in row chunks of at most 64 elements, in the inputs' dtype
        assert ("transformer.h.0.attn.c_attn.weight", (1, 48), torch.float64) in max_method.CALLS
    dry = cli(["merge", "test-max", "-m", ",".join(pair), "--config", config, "--dry-run"])
    assert dry.exit_code == 0, dry.stderr
    plan = json.loads(dry.stdout)
    assert plan["technique"] == "merge.test-max" and plan["config"]["shift"] == 0.0
    assert "--shift" in cli(["merge", "test-max", "--help"]).stdout


def test_the_method_is_called_with_the_same_arguments_in_memory_and_streamed(max_method, pair, tmp_path):
    from toolkit.core.context import RunContext
    from toolkit.merge.weightspace import run_weightspace

    calls = max_method.CALLS
    for stream in (True, False):
        calls.clear()
        run_weightspace(max_method.MaxConfig(models=pair, stream=stream, shift=1.0),
                        RunContext(out=tmp_path / f"s{stream}", quiet=True))
        seen = {(name, dtype) for name, _, dtype in calls}
        assert ("transformer.h.1.mlp.c_fc.weight", torch.float64) in seen  # float64 numerics by default
    assert all(len(inspect.signature(e.obj).parameters) == 4 for e in registry("merge") if e.meta.get("tensorwise"))


def test_merge_states_picks_the_method_by_name():
    states = [{"w": torch.tensor([1.0, -2.0, 3.0])}, {"w": torch.tensor([0.0, 5.0, -1.0])}]
    averaged = common.merge_states(AverageConfig(weights=[3.0, 1.0]), states, None)
    assert torch.allclose(averaged["w"], torch.tensor([0.75, -0.25, 2.0]))
    summed = common.merge_states(AverageConfig(weights=[3.0, 1.0], normalize=False), states, None)
    assert torch.allclose(summed["w"], torch.tensor([3.0, -1.0, 8.0]))  # mergekit's linear, normalize: false


def test_unknown_and_whole_model_methods_and_bad_lists_are_one_clear_error():
    states = [{"w": torch.zeros(2)}, {"w": torch.ones(2)}]
    with pytest.raises(BadInputError, match="unknown merge method 'nope'") as info:
        common.method_of("nope")
    assert "average" in info.value.one_line() and "ties" in info.value.one_line()
    with pytest.raises(BadInputError, match="does not merge tensor by tensor"):
        common.method_of("latent")
    with pytest.raises(BadInputError, match="needs a base model"):
        common.merge_states(TiesConfig(base="b"), states, None)
    for config in (AverageConfig(weights=[1.0]), TaskArithmeticConfig(base="b", weights=[1.0, 2.0, 3.0])):
        with pytest.raises(BadInputError, match="merge weights for 2 models"):
            common.merge_states(config, states, states[0])


def test_every_method_module_is_discovered_and_listed_by_the_cli():
    import typer

    import toolkit.merge.methods as package
    from cli.main import app
    from toolkit.merge import mergekit

    modules = {f"toolkit.merge.methods.{m.name}" for m in pkgutil.iter_modules(package.__path__)}
    assert modules == {e.obj.__module__ for e in registry("merge")}
    merge = typer.main.get_command(app).commands["merge"]
    commands = {name: set(getattr(cmd, "commands", {}) or {}) for name, cmd in merge.commands.items()}
    for method in registry("merge"):
        group = method.meta.get("group")
        name = method.meta.get("command", method.name)
        assert (name in commands[group]) if group else (name in commands), method.name
    assert {m: mergekit.technique_of(m) for m in ("linear", "task_arithmetic", "ties", "slerp", "dare_ties")} == {
        "linear": "merge.average", "task_arithmetic": "merge.task-arithmetic", "ties": "merge.ties",
        "slerp": "merge.slerp", "dare_ties": "merge.dare-ties"}
