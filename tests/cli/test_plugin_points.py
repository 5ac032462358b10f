"""Every room's plug-in point, as a newcomer uses it: a throw-away method in a module of its own (written to a
temporary directory, never into the package) registers itself, and the room's CLI command, --config, --dry-run
and run.json see it with no other edit; the built-in methods take exactly the arguments of the room's protocol.
(merge: tests/unit/test_merge_registry.py; edit: tests/unit/test_edit_registry.py.)"""

from __future__ import annotations

import json

import pytest
import torch
from testkit import throwaway_method

from toolkit.core.registry import conforms, registry

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def mod(tmp_path):
    (tmp_path / "mod").mkdir()
    return tmp_path / "mod"


def _yaml(path, text):
    path.write_text(text)
    return path


def test_builtin_methods_follow_their_rooms_protocols():
    import toolkit.compress.config  # noqa: F401 - each room declares its registry's modules in its config module
    import toolkit.explain.config  # noqa: F401
    import toolkit.merge.config  # noqa: F401
    import toolkit.steer.run  # noqa: F401
    import toolkit.unlearn.config  # noqa: F401
    from toolkit.compress.job import CompressMethod
    from toolkit.explain.config import Explainer
    from toolkit.merge.common import TensorMethod
    from toolkit.steer.estimators import Estimator
    from toolkit.unlearn.train import UnlearnMethod

    rooms = {"compress": CompressMethod, "unlearn": UnlearnMethod, "steer": Estimator, "explain": Explainer}
    for kind, protocol in rooms.items():
        builtin = [e for e in registry(kind) if e.obj.__module__.startswith("toolkit.")]
        assert builtin and all(conforms(e.obj, protocol) for e in builtin), kind
    from toolkit.compress.stages import TransformStage

    stages = [e for e in registry("compress-stage") if e.obj.__module__.startswith("toolkit.")]
    assert {e.meta["role"] for e in stages} == {"transform", "prune", "quantize"}
    assert all(conforms(e.obj, TransformStage if e.meta["role"] == "transform" else CompressMethod) for e in stages)
    tensorwise = [e for e in registry("merge") if e.meta.get("tensorwise")]
    assert len(tensorwise) >= 10 and all(conforms(e.obj, TensorMethod) for e in tensorwise)


STEER = '''
from toolkit.core.registry import register


@register("steer", "test-first", paired=False, help="The first undesired minus the first neutral row (test only).")
def first(undesired, neutral, pair_index=0):
    return undesired[0] - neutral[0]
'''


def test_steer_throwaway_estimator(cli, mod, tmp_path, tiny_llama_dir):
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"undesired": f"bad thing {i}", "neutral": f"good thing {i}"}) + "\n"
                             for i in range(3)))
    config = _yaml(tmp_path / "steer.yaml", "position: mean\n")
    with throwaway_method(mod, "steer", STEER, "cli.steer"):
        args = ["steer", "test-first", "-m", tiny_llama_dir, "-d", pairs, "--layer", "1", "--config", config]
        dry = cli([*args, "--dry-run"])
        assert dry.exit_code == 0, dry.stderr
        assert json.loads(dry.stdout)["config"]["method"] == "test-first"
        r = cli([*args, "-o", tmp_path / "out"])
        assert r.exit_code == 0, r.stderr
        from toolkit.steer.estimators import split_half_cosine

        u, n = torch.randn(4, 3), torch.randn(5, 3)
        assert -1 <= split_half_cosine("test-first", u, n, repeats=2) <= 1  # unpaired: halves drawn independently
    record = json.loads((tmp_path / "out" / "run.json").read_text())
    assert record["technique"] == "steer.test-first" and record["config"]["position"] == "mean"
    from toolkit.steer.intervene import load_directions

    directions, meta = load_directions(tmp_path / "out" / "directions.safetensors")
    assert meta["method"] == "test-first" and set(directions) == {1}


UNLEARN = '''
from typing import Literal

from pydantic import Field

from toolkit.core.registry import register
from toolkit.unlearn.config import TRAIN_FLAGS, UnlearnConfig


class BiasConfig(UnlearnConfig):
    method: Literal["test-bias"] = "test-bias"
    bias_sign: float = Field(1.0, description="Sign of the final norm's bias sum to minimise.")


@register("unlearn", "test-bias", config=BiasConfig, needs_retain=False, flags=[*TRAIN_FLAGS, "bias_sign"],
          help="Minimise the final norm's bias sum (test only).")
def bias(config, ctx, model, corpus):
    params = [model.transformer.ln_f.bias]

    def step(s):
        loss = config.bias_sign * s.params[0].sum()
        s.backward(loss)
        return {"bias_sum": loss.item()}

    return step, params, {"trained": "ln_f.bias"}
'''


def test_unlearn_throwaway_objective(cli, mod, tmp_path, tiny_gpt2_dir):
    forget = tmp_path / "forget.json"
    forget.write_text(json.dumps(["some text to forget about a thing"] * 4))
    config = _yaml(tmp_path / "u.yaml", "max_steps: 2\nmax_length: 16\n")
    with throwaway_method(mod, "unlearn", UNLEARN, "cli.unlearn"):
        args = ["unlearn", "test-bias", "-m", tiny_gpt2_dir, "-f", forget, "--config", config, "--bias-sign", "-1"]
        dry = cli([*args, "--dry-run"])
        assert dry.exit_code == 0, dry.stderr
        assert json.loads(dry.stdout)["plan"]["objective"] == "test-bias"
        r = cli([*args, "--lr", "0.01", "-o", tmp_path / "out"])
        assert r.exit_code == 0, r.stderr
    record = json.loads((tmp_path / "out" / "run.json").read_text())
    assert record["technique"] == "unlearn.test-bias" and record["config"]["bias_sign"] == -1.0
    assert record["metrics"]["steps"] == 2 and record["metrics"]["trained"] == "ln_f.bias"
    from safetensors.torch import load_file

    before = load_file(tiny_gpt2_dir / "model.safetensors")["transformer.ln_f.bias"]
    after = load_file(tmp_path / "out" / "model" / "model.safetensors")["transformer.ln_f.bias"]
    assert bool((after > before).all())  # the bias sum was maximised (sign -1): every entry went up


EXPLAIN = '''
from typing import Literal

from pydantic import Field

from toolkit.core.registry import register
from toolkit.explain.config import FormalConfig


class AllConfig(FormalConfig):
    method: Literal["test-all"] = "test-all"
    keep: int = Field(3, description="Pixels in every explanation (test only).")


@register("explain", "test-all", config=AllConfig, flags=["keep"], help="The first pixels (test only).")
def explain_all(config, ctx):
    ctx.metrics.update({"explained": config.n_samples, "pixels": config.keep})
    return ctx.metrics
'''


def test_explain_throwaway_explainer(cli, mod, tmp_path):
    config = _yaml(tmp_path / "e.yaml", "epsilon: 0.2\n")
    with throwaway_method(mod, "explain", EXPLAIN, "cli.explain"):
        args = ["explain", "test-all", "-m", "net", "--config", config, "--keep", "5", "-n", "2"]
        dry = cli([*args, "--dry-run"])
        assert dry.exit_code == 0, dry.stderr
        assert json.loads(dry.stdout)["plan"]["epsilon"] == 0.2
        r = cli([*args, "--out", tmp_path / "out"])
        assert r.exit_code == 0, r.stderr
    record = json.loads((tmp_path / "out" / "run.json").read_text())
    assert record["technique"] == "explain.test-all" and record["config"]["keep"] == 5
    assert record["metrics"] == {"explained": 2, "pixels": 5}


COMPRESS = '''
from typing import Literal

from pydantic import Field

from toolkit.compress.config import BASE_FLAGS, CompressConfig
from toolkit.core.registry import register


class HalfConfig(CompressConfig):
    method: Literal["test-half"] = "test-half"
    w_bits: int = 16
    fraction: float = Field(0.5, description="Share of input columns zeroed, from the left (test only).")


@register("compress", "test-half", config=HalfConfig, needs_hessian=False, flags=[*BASE_FLAGS, "fraction"],
          help="Zero the first input columns (test only).")
def half(job):
    import torch

    keep = torch.ones_like(job.W, dtype=torch.bool)
    keep[:, :int(job.config.fraction * job.W.shape[1])] = False
    return job.rounded(keep)
'''


def test_compress_throwaway_method(cli, mod, tmp_path, tiny_llama_dir, text_file):
    config = _yaml(tmp_path / "c.yaml", "nsamples: 2\nseqlen: 16\nexport: dense\n")
    with throwaway_method(mod, "compress", COMPRESS, "cli.compress"):
        args = ["compress", "test-half", "-m", tiny_llama_dir, "-d", text_file, "--config", config, "--no-rotate",
                "--fraction", "0.25"]
        dry = cli([*args, "--dry-run"])
        assert dry.exit_code == 0, dry.stderr
        assert json.loads(dry.stdout)["config"]["fraction"] == 0.25
        r = cli([*args, "-o", tmp_path / "out"])
        assert r.exit_code == 0, r.stderr
    record = json.loads((tmp_path / "out" / "run.json").read_text())
    assert record["technique"] == "compress.test-half" and record["config"]["fraction"] == 0.25
    from safetensors.torch import load_file

    weights = load_file(tmp_path / "out" / "model" / "model.safetensors")
    q = weights["model.layers.0.self_attn.q_proj.weight"]
    assert bool((q[:, :8] == 0).all()) and bool((q[:, 8:] != 0).all())  # 32 inputs: the first quarter zeroed


STAGE = '''
import torch
from pydantic import Field

from toolkit.core.config import BaseConfig
from toolkit.core.registry import register


class LeftConfig(BaseConfig):
    fraction: float = Field(0.5, ge=0, lt=1, description="Share of input columns pruned, from the left (test only).")


@register("compress-stage", "test-left", config=LeftConfig, role="prune", knobs=["fraction"])
def left(job):
    keep = torch.ones_like(job.W, dtype=torch.bool)
    keep[:, :int(job.config.fraction * job.W.shape[1])] = False
    return job.W, keep, None
'''


def test_compress_throwaway_recipe_stage(cli, mod, tmp_path, tiny_llama_dir, text_file):
    """A pruning stage in a module of its own composes with a built-in quantizer in a recipe."""
    recipe = _yaml(tmp_path / "r.yaml", "stages:\n  - test-left: {fraction: 0.25}\n  - rtn: {w_bits: 8}\n")
    config = _yaml(tmp_path / "c.yaml", "nsamples: 2\nseqlen: 16\nexport: dense\n")
    with throwaway_method(mod, "compress-stage", STAGE, "cli.compress"):
        args = ["compress", "recipe", "--recipe", recipe, "-m", tiny_llama_dir, "-d", text_file, "--config", config]
        dry = cli([*args, "--dry-run"])
        assert dry.exit_code == 0, dry.stderr
        assert json.loads(dry.stdout)["plan"]["stages"][0] == {"stage": "test-left", "role": "prune",
                                                               "knobs": {"fraction": 0.25}}
        r = cli([*args, "-o", tmp_path / "out"])
        assert r.exit_code == 0, r.stderr
    record = json.loads((tmp_path / "out" / "run.json").read_text())
    assert record["config"]["stages"][0] == {"test-left": {"fraction": 0.25}}
    from safetensors.torch import load_file

    q = load_file(tmp_path / "out" / "model" / "model.safetensors")["model.layers.0.self_attn.q_proj.weight"]
    assert bool((q[:, :8] == 0).all()) and (q[:, 8:] != 0).float().mean() > 0.9  # quarter pruned, the rest W8
