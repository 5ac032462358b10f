"""Configs and runs of the weight-space baselines: `merge average | task-arithmetic | ties | padded`."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from toolkit.core.config import BaseConfig
from toolkit.merge import baselines
from toolkit.merge.common import finish, load_parents, pick_target, record_depths
from toolkit.merge.projection import lay_out

TA_PAPER = "https://arxiv.org/abs/2212.04089"
TIES_PAPER = "https://arxiv.org/abs/2306.01708"


class AverageConfig(BaseConfig):
    """Weight averaging (model soup) of same-size models."""

    models: list[str] = Field(default_factory=list, description="Models to merge (paths or zoo:NAME).")
    weights: list[float] | None = Field(None, description="One weight per model (normalised); default uniform.")


class TaskArithmeticConfig(BaseConfig):
    """Task arithmetic (Ilharco et al., ICLR 2023, https://arxiv.org/abs/2212.04089): θ_base + λ Σ (θ_i − θ_base)."""

    models: list[str] = Field(default_factory=list, description="Fine-tuned models.")
    base: str = Field(..., description="The common pre-trained model the task vectors are taken from.")
    scaling: float = Field(1.0, ge=0.0, description="λ, the task-vector scaling (paper: tuned on validation).")


class TiesConfig(BaseConfig):
    """TIES-Merging (Yadav et al., NeurIPS 2023, https://arxiv.org/abs/2306.01708; github.com/prateeky2806/ties-merging)."""

    models: list[str] = Field(default_factory=list, description="Fine-tuned models.")
    base: str = Field(..., description="The common pre-trained model.")
    density: float = Field(0.2, gt=0.0, le=1.0, description="Fraction k of each task vector kept (paper: top 20%).")
    scaling: float = Field(1.0, ge=0.0, description="λ applied to the merged task vector (paper: 1).")


class PaddedConfig(BaseConfig):
    """Different sizes: zero-pad/truncate each model to the target's shapes, then average (the naive baseline).
    Shallower models are first deepened with identity layers to the target's depth (deepen.py; deeper ones are
    refused). With align=true, the models are then projected by our dimensionality-matching projection: MLP units
    and CNN channels weight-matched to the target, GPT-2 widened function-preservingly (toolkit/merge/projection.py)."""

    models: list[str] = Field(default_factory=list, description="Models to merge (may differ in width and depth).")
    target: str | None = Field(None, description="Model whose shapes the merge takes (default: the deepest, "
                                                     "then largest).")
    weights: list[float] | None = Field(None, description="One weight per model; default uniform.")
    align: bool = Field(False, description="Project first: weight-match MLP units / CNN channels, widen GPT-2.")
    fill: Literal["zero", "duplicate"] = Field("zero", description="With align, spare units of a widened MLP/CNN: "
                                               "zero units or copies of matched units.")


def run_average(config: AverageConfig, ctx) -> None:
    parents = load_parents(config.models, ctx.device)
    state = baselines.average([p.state for p in parents], config.weights)
    finish(ctx, parents, parents[0], state, "merge.average", "", {"weights": config.weights})


def run_task_arithmetic(config: TaskArithmeticConfig, ctx) -> None:
    parents = load_parents(config.models, ctx.device)
    base = pick_target(parents, config.base, ctx.device)
    state = baselines.task_arithmetic([p.state for p in parents], base.state, config.scaling)
    finish(ctx, parents, base, state, "merge.task-arithmetic", TA_PAPER, {"scaling": config.scaling})


def run_ties(config: TiesConfig, ctx) -> None:
    parents = load_parents(config.models, ctx.device)
    base = pick_target(parents, config.base, ctx.device)
    state = baselines.ties([p.state for p in parents], base.state, config.density, config.scaling)
    finish(ctx, parents, base, state, "merge.ties", TIES_PAPER, {"density": config.density, "scaling": config.scaling})


def run_padded(config: PaddedConfig, ctx) -> None:
    parents = load_parents(config.models, ctx.device, depths_may_differ=True)
    target = pick_target(parents, config.target, ctx.device)
    state = baselines.average([lay_out(p, target, config.align, config.fill) for p in parents], config.weights)
    finish(ctx, parents, target, state, "merge.padded", "", {"target": target.source, "align": config.align,
                                                                    "fill": config.fill})
    record_depths(ctx, parents, target)
