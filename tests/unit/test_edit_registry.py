"""Edit methods come from the "edit" registry (a method = one module in toolkit/edit/methods/): MEMIT and EAMET are
registered there and are the CLI's commands, and a method registered here, in the test, is run by its name."""

from pathlib import Path
from typing import Literal

import pytest
import torch

from toolkit.core.errors import BadInputError
from toolkit.core.registry import register, registry
from toolkit.edit.config import EametConfig, MemitConfig

pytestmark = pytest.mark.usefixtures("one_thread")

FAST = dict(cov_tokens=256, cov_seqlen=32, context_prefixes=1, prefix_tokens=3, fluency_samples=0,
            v_num_grad_steps=5, eval_before=False)


def test_memit_and_eamet_are_registered_commands(cli):
    assert {"memit", "eamet"} <= set(registry("edit").names())
    assert registry("edit").get("memit").config is MemitConfig
    assert registry("edit").get("eamet").config is EametConfig
    assert registry("edit").get("memit").obj(MemitConfig(model="m", data="d")) is None
    assert registry("edit").get("eamet").obj(EametConfig(model="m", data="d")) is not None
    assert registry("edit").get("eamet").obj(EametConfig(model="m", data="d", cs_factor=0, mse_factor=0)) is None
    result = cli(["edit", "--help"])
    assert result.exit_code == 0
    for name in registry("edit").names():
        assert name in result.stdout


def test_unknown_method_is_bad_input():
    with pytest.raises(BadInputError, match="unknown edit method 'nope'"):
        registry("edit").get("nope")


class ZeroLossConfig(MemitConfig):
    method: Literal["zero-loss"] = "zero-loss"


class ZeroLoss:
    """A value strategy whose extra loss is 0: it only records which requests it was asked about. It has the
    members of values.ValueAlignment and nothing else (__slots__), so the runner can call nothing the protocol
    does not declare."""

    __slots__ = ("spans", "recorded", "batches", "sequential")

    def __init__(self, sequential=True):
        self.spans, self.recorded, self.batches, self.sequential = [], [], [], sequential

    def __getattribute__(self, name):
        from toolkit.core.registry import protocol_members
        from toolkit.edit.values import ValueAlignment

        if not name.startswith("__") and name not in ("spans", "recorded", "batches") \
                and name not in protocol_members(ValueAlignment):
            raise AssertionError(f"the edit runner used '{name}', which values.ValueAlignment does not declare")
        return object.__getattribute__(self, name)

    def begin_batch(self, keys_z):
        self.batches.append(tuple(keys_z.shape))

    def loss(self, delta, span):
        self.spans.append((span.start, span.stop))
        return delta.sum(-1) * 0

    def record(self, delta, span):
        self.recorded.append((span.start, span.stop))


def _facts(tmp_path: Path) -> Path:
    import json

    path = tmp_path / "facts.jsonl"
    path.write_text("\n".join(json.dumps({"prompt": "The new name of {}", "subject": s, "target_new": t})
                              for s, t in [("object", "the"), ("list", "in"), ("module", "is")]))
    return path


def test_a_method_registered_here_is_run_by_name(tmp_path, tiny_gpt2_dir):
    from safetensors.torch import load_file

    from toolkit.core.context import RunContext, seed_everything
    from toolkit.edit.run import run

    used = []

    @register("edit", "zero-loss", config=ZeroLossConfig, replace=True, help="test", flags=[])
    def zero_loss(config):
        used.append(ZeroLoss(sequential=True))
        return used[-1]

    common = dict(model=str(tiny_gpt2_dir), data=str(_facts(tmp_path)), stats_dir=str(tmp_path / "stats"), **FAST)
    ours = RunContext(out=tmp_path / "zero", quiet=True)
    seed_everything(0)  # the context templates are sampled
    metrics = run(ZeroLossConfig(**common), ours)
    assert len(used) == 1 and used[0].spans and sorted(set(used[0].recorded)) == [(0, 1), (1, 2), (2, 3)]
    assert used[0].batches == [(3, 128)]  # begin_batch: the batch's keys (the MLP width) at the last edit layer
    assert metrics["n_edits"] == 3 and ours.metrics["n_edits"] == 3
    memit = RunContext(out=tmp_path / "memit", quiet=True)
    seed_everything(0)
    run(MemitConfig(**common), memit)
    # a zero extra loss is MEMIT's objective (requests one at a time instead of batched: the same δ)
    a = load_file(str(tmp_path / "zero" / "model" / "model.safetensors"))
    b = load_file(str(tmp_path / "memit" / "model" / "model.safetensors"))
    assert all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)
    assert any(not torch.equal(a[k], load_file(str(tiny_gpt2_dir / "model.safetensors"))[k]) for k in a)


def test_a_config_of_another_method_is_refused(tmp_path):
    from toolkit.edit.run import method_of

    class Other(MemitConfig):
        method: Literal["needs-eamet-config"] = "needs-eamet-config"

    register("edit", "needs-eamet-config", config=EametConfig, replace=True, help="test", flags=[])(lambda c: None)
    with pytest.raises(BadInputError, match="needs a EametConfig"):
        method_of(Other(model="m", data="d"))


def test_a_non_sequential_alignment_is_optimised_in_batches(tmp_path, tiny_gpt2_dir):
    """One request at a time is EAMET's declared need (sequential = True), not every alignment's."""
    from toolkit.core.context import RunContext, seed_everything
    from toolkit.edit.run import run

    used = []

    @register("edit", "zero-loss", config=ZeroLossConfig, replace=True, help="test", flags=[])
    def zero_loss(config):
        used.append(ZeroLoss(sequential=False))
        return used[-1]

    seed_everything(0)
    run(ZeroLossConfig(model=str(tiny_gpt2_dir), data=str(_facts(tmp_path)), stats_dir=str(tmp_path / "stats"),
                       save_model=False, **FAST), RunContext(out=tmp_path / "batched", quiet=True))
    assert used[0].recorded == [(0, 3)] and set(used[0].spans) == {(0, 3)}


def test_the_builtin_alignment_has_every_member_of_the_protocol():
    from toolkit.core.registry import conforms, protocol_members
    from toolkit.edit.eamet import EmbeddingAlignment
    from toolkit.edit.values import EditMethod, ValueAlignment

    alignment = EmbeddingAlignment(EametConfig(model="m", data="d"))
    assert protocol_members(ValueAlignment) == {"sequential", "begin_batch", "loss", "record"}
    assert all(hasattr(alignment, name) for name in protocol_members(ValueAlignment))
    assert alignment.sequential is True
    assert all(conforms(e.obj, EditMethod) for e in registry("edit") if e.obj.__module__.startswith("toolkit."))


THROWAWAY = """
from typing import Literal

from pydantic import Field

from toolkit.core.registry import register
from toolkit.edit.config import BASE_FLAGS, MemitConfig


class HalfConfig(MemitConfig):
    method: Literal["test-half"] = "test-half"
    half_weight: float = Field(0.0, description="Weight of the test's extra loss.")


class Half:
    sequential = False

    def __init__(self, weight):
        self.weight = weight

    def begin_batch(self, keys_z):
        pass

    def loss(self, delta, span):
        return self.weight * delta.square().sum(-1)

    def record(self, delta, span):
        pass


@register("edit", "test-half", config=HalfConfig, flags=[*BASE_FLAGS, "half_weight"], help="test only")
def half(config):
    return Half(config.half_weight) if config.half_weight else None
"""


def test_a_throwaway_method_gets_cli_config_dry_run_and_run_json(cli, tmp_path, tiny_gpt2_dir):
    import json

    from testkit import throwaway_method

    (tmp_path / "mod").mkdir()
    config = tmp_path / "half.yaml"
    config.write_text("half_weight: 0.5\ncov_tokens: 256\ncov_seqlen: 32\ncontext_prefixes: 1\nprefix_tokens: 3\n"
                      "fluency_samples: 0\neval_before: false\nsave_model: false\n")
    with throwaway_method(tmp_path / "mod", "edit", THROWAWAY, "cli.edit"):
        assert "--half-weight" in cli(["edit", "test-half", "--help"]).stdout
        args = ["edit", "test-half", "-m", tiny_gpt2_dir, "-d", _facts(tmp_path), "--config", config, "--steps", "3",
                "--set", f"stats_dir={tmp_path / 'stats'}"]
        dry = cli([*args, "--dry-run"])
        assert dry.exit_code == 0, dry.stderr
        assert json.loads(dry.stdout)["plan"]["method"] == "test-half"
        r = cli([*args, "--half-weight", "0.25", "-o", tmp_path / "out"])
        assert r.exit_code == 0, r.stderr
    record = json.loads((tmp_path / "out" / "run.json").read_text())
    assert record["technique"] == "edit.test-half" and record["config"]["half_weight"] == 0.25
    assert record["config"]["v_num_grad_steps"] == 3 and record["metrics"]["n_edits"] == 3
