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
    """A value strategy whose extra loss is 0: it only records which requests it was asked about."""

    def __init__(self):
        self.spans, self.recorded = [], []

    def begin_batch(self, keys_z):
        pass

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
        used.append(ZeroLoss())
        return used[-1]

    common = dict(model=str(tiny_gpt2_dir), data=str(_facts(tmp_path)), stats_dir=str(tmp_path / "stats"), **FAST)
    ours = RunContext(out=tmp_path / "zero", quiet=True)
    seed_everything(0)  # the context templates are sampled
    metrics = run(ZeroLossConfig(**common), ours)
    assert len(used) == 1 and used[0].spans and sorted(set(used[0].recorded)) == [(0, 1), (1, 2), (2, 3)]
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
