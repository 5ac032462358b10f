"""Configs and runs of the weight-space baselines: `merge average | task-arithmetic | ties | padded`."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from toolkit.core.config import BaseConfig
from toolkit.merge import baselines
from toolkit.merge.common import finish, load_parents, pick_target, record_depths, stream_merge, streamable
from toolkit.merge.models import parse_model_list
from toolkit.merge.projection import lay_out

TA_PAPER = "https://arxiv.org/abs/2212.04089"
TIES_PAPER = "https://arxiv.org/abs/2306.01708"


class StreamingFields(BaseConfig):
    """How the same-size merges read and write: streamed tensor by tensor from local safetensors directories."""

    stream: bool | None = Field(None, description="Stream one tensor at a time from the safetensors files (default: "
                                                  "when every model is a local safetensors directory not scored "
                                                  "on a held-out text).")
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = Field(
        "auto", description="Output dtype; auto = the inputs' dtype when streaming (float32 otherwise).")


class AverageConfig(StreamingFields):
    """Weight averaging (model soup) of same-size models."""

    models: list[str] = Field(default_factory=list, description="Models to merge (paths or zoo:NAME).")
    weights: list[float] | None = Field(None, description="One weight per model (normalised); default uniform.")


class TaskArithmeticConfig(StreamingFields):
    """Task arithmetic (Ilharco et al., ICLR 2023, https://arxiv.org/abs/2212.04089): θ_base + λ Σ (θ_i − θ_base)."""

    models: list[str] = Field(default_factory=list, description="Fine-tuned models.")
    base: str = Field(..., description="The common pre-trained model the task vectors are taken from.")
    scaling: float = Field(1.0, ge=0.0, description="λ, the task-vector scaling (paper: tuned on validation).")


class TiesConfig(StreamingFields):
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


def _streams(config, specs: list[str]) -> bool:
    if config.stream is None:
        return streamable(specs)
    if config.stream:
        from toolkit.core.errors import require

        require(streamable(specs), "stream=true needs every model to be a local safetensors directory",
                hint="drop stream=true to load the models")
    return config.stream


def _cast(config, template, state):
    """The in-memory merge in the chosen dtype (the loaded models are float32)."""
    if config.dtype == "auto":
        return state
    import torch

    dtype = getattr(torch, config.dtype)
    if template.hf_model is not None:
        template.hf_model.to(dtype)
    return {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}


def run_average(config: AverageConfig, ctx) -> None:
    specs = parse_model_list(config.models)
    if _streams(config, specs):
        stream_merge(ctx, "average", specs, None, "merge.average", "", {"weights": config.weights},
                     weights=config.weights, dtype=config.dtype)
        return
    parents = load_parents(config.models, ctx.device)
    state = baselines.average([p.state for p in parents], config.weights)
    finish(ctx, parents, parents[0], _cast(config, parents[0], state), "merge.average", "",
           {"weights": config.weights})


def run_task_arithmetic(config: TaskArithmeticConfig, ctx) -> None:
    specs = parse_model_list(config.models)
    if _streams(config, specs + [config.base]):
        stream_merge(ctx, "task-arithmetic", specs, config.base, "merge.task-arithmetic", TA_PAPER,
                     {"scaling": config.scaling}, scaling=config.scaling, dtype=config.dtype)
        return
    parents = load_parents(config.models, ctx.device)
    base = pick_target(parents, config.base, ctx.device)
    state = baselines.task_arithmetic([p.state for p in parents], base.state, config.scaling)
    finish(ctx, parents, base, _cast(config, base, state), "merge.task-arithmetic", TA_PAPER,
           {"scaling": config.scaling})


def run_ties(config: TiesConfig, ctx) -> None:
    specs = parse_model_list(config.models)
    if _streams(config, specs + [config.base]):
        stream_merge(ctx, "ties", specs, config.base, "merge.ties", TIES_PAPER,
                     {"density": config.density, "scaling": config.scaling}, scaling=config.scaling,
                     density=config.density, dtype=config.dtype)
        return
    parents = load_parents(config.models, ctx.device)
    base = pick_target(parents, config.base, ctx.device)
    state = baselines.ties([p.state for p in parents], base.state, config.density, config.scaling)
    finish(ctx, parents, base, _cast(config, base, state), "merge.ties", TIES_PAPER,
           {"density": config.density, "scaling": config.scaling})


def run_padded(config: PaddedConfig, ctx) -> None:
    parents = load_parents(config.models, ctx.device, depths_may_differ=True)
    target = pick_target(parents, config.target, ctx.device)
    state = baselines.average([lay_out(p, target, config.align, config.fill) for p in parents], config.weights)
    finish(ctx, parents, target, state, "merge.padded", "", {"target": target.source, "align": config.align,
                                                                    "fill": config.fill})
    record_depths(ctx, parents, target)
