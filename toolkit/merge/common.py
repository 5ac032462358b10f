"""What every merge command shares: loading the parents, saving the merge, scoring digits models."""

from __future__ import annotations

from pathlib import Path

import torch

from toolkit.core.errors import require
from toolkit.merge.deepen import depth_of
from toolkit.merge.models import (
    PlainModel,
    check_same_family,
    evaluate,
    like,
    load_for_merge,
    parse_model_list,
    save_merged,
)


def load_parents(models: list[str], device: str, depths_may_differ: bool = False) -> list[PlainModel]:
    """The parents, one family; `depths_may_differ` for merges that project into a target layout (deepening)."""
    parents = [load_for_merge(spec, device) for spec in parse_model_list(models)]
    check_same_family(parents, depths_may_differ)
    return parents


def pick_target(parents: list[PlainModel], target: str | None, device: str) -> PlainModel:
    """The layout to merge into: --target (a parent or any model of the family), else the deepest parent, the
    largest among equally deep ones (the projection deepens shallower models but never drops layers)."""
    if target is None:
        return max(parents, key=lambda m: (depth_of(m) or 0, sum(t.numel() for t in m.state.values())))
    for parent in parents:
        if _same_model(parent.source, target):
            return parent
    model = load_for_merge(target, device)
    check_same_family([parents[0], model], depths_may_differ=True)
    return model


def record_depths(ctx, parents: list[PlainModel], target: PlainModel) -> None:
    """Depth of every parent and of the target layout in run.json (shallower parents were deepened)."""
    if depth_of(target) is not None:
        ctx.metrics["depths"] = {"target": depth_of(target),
                                 **{f"parent{i}": depth_of(p) for i, p in enumerate(parents)}}


def _same_model(source: str, spec: str) -> bool:
    if Path(spec).exists() and Path(source).exists():
        return Path(source).resolve() == Path(spec).resolve()
    return source == spec


def parent_tasks(parents: list[PlainModel]) -> tuple[dict | None, dict | None]:
    """The tasks of parents A and B (digit classes, or a held-out text for LMs) the merge is scored on."""
    return parents[0].task, parents[1].task


def finish(ctx, parents: list[PlainModel], template: PlainModel, state: dict[str, torch.Tensor], technique: str,
           paper: str, metadata: dict) -> PlainModel:
    """Check, save and score the merge; parents' own scores go to baselines for the summary table."""
    for name, tensor in state.items():
        require(not tensor.is_floating_point() or bool(torch.isfinite(tensor).all()),
                f"the merge produced NaN/Inf in '{name}'")
    merged = like(template, state)
    save_merged(merged, ctx.path("model"), technique, [p.source for p in parents], paper,
                command="", metadata=metadata)
    task_a, task_b = parent_tasks(parents)
    ctx.metrics.update(evaluate(merged, task_a, task_b))
    for index, parent in enumerate(parents):
        scores = evaluate(parent, task_a, task_b)
        if scores:
            ctx.baselines[f"parent{index}"] = scores
    ctx.metrics["n_models"] = len(parents)
    return merged
