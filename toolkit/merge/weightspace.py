"""Runs of the weight-space merges: `merge average | task-arithmetic | ties | ...` (any registered tensor-by-tensor
method, toolkit/merge/methods/) and `merge padded`; their configs are in toolkit/merge/config.py."""

from __future__ import annotations

from toolkit.merge.common import (
    finish,
    load_parents,
    merge_states,
    method_of,
    numerics_note,
    pick_target,
    record_depths,
    stream_merge,
    streamable,
)
from toolkit.merge.config import AverageConfig, PaddedConfig
from toolkit.merge.models import parse_model_list
from toolkit.merge.projection import lay_out


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


def run_weightspace(config, ctx) -> None:
    """`iclrkit merge <method>` for a registered tensor-by-tensor method (`config.method`): streamed when every
    model is a local safetensors directory, else loaded, merged in memory, saved and scored."""
    method = method_of(config.method)
    technique, paper = f"merge.{method.name}", method.meta.get("paper", "")
    metadata = {key: getattr(config, key) for key in method.meta.get("record", ())}
    base = getattr(config, "base", None) if method.needs_base else None
    specs = parse_model_list(config.models)
    if _streams(config, specs + ([base] if base is not None else [])):
        stream_merge(ctx, config, specs, base, technique, paper, metadata)
        return
    parents = load_parents(config.models, ctx.device) if len(specs) > 1 else [_one(specs[0], ctx)]
    template = pick_target(parents, base, ctx.device) if method.needs_base else parents[0]
    state = merge_states(config, [p.state for p in parents], template.state if method.needs_base else None,
                         seed=ctx.seed)
    finish(ctx, parents, template, _cast(config, template, state), technique, paper, metadata,
           notes=numerics_note(config))


def _one(spec: str, ctx):
    """A merge of one model and its base (task vectors, slerp): load_parents wants two."""
    from toolkit.merge.models import load_for_merge

    return load_for_merge(spec, ctx.device)


def run_padded(config: PaddedConfig, ctx) -> None:
    parents = load_parents(config.models, ctx.device, depths_may_differ=True)
    target = pick_target(parents, config.target, ctx.device)
    laid_out = [lay_out(p, target, config.align, config.fill) for p in parents]
    state = merge_states(AverageConfig(models=[p.source for p in parents], weights=config.weights), laid_out, None)
    finish(ctx, parents, target, state, "merge.padded", "", {"target": target.source, "align": config.align,
                                                                    "fill": config.fill})
    record_depths(ctx, parents, target)
