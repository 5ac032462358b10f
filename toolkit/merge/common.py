"""What every merge command shares: loading the parents, saving the merge, scoring digits models."""

from __future__ import annotations

from pathlib import Path

import torch

from toolkit.core.errors import BadInputError, require
from toolkit.core.records import command_line
from toolkit.merge.config import MergeOptions
from toolkit.merge.deepen import depth_of
from toolkit.merge.evaluate import evaluate
from toolkit.merge.models import (
    PlainModel,
    check_same_family,
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
                command=command_line(), metadata=metadata)
    task_a, task_b = parent_tasks(parents)
    ctx.metrics.update(evaluate(merged, task_a, task_b))
    for index, parent in enumerate(parents):
        scores = evaluate(parent, task_a, task_b)
        if scores:
            ctx.baselines[f"parent{index}"] = scores
    ctx.metrics["n_models"] = len(parents)
    return merged


# -- streaming merges: one tensor of each input at a time, straight into the output shards --------------------------

STREAM_CHUNK = 1 << 22  # float64 elements per row chunk of an elementwise merge (32 MB)
STREAM_SHARD_BYTES = 2 * 10**9  # output shard size (as transformers' default max_shard_size)
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def streamable(specs: list[str]) -> bool:
    """True when every model is a local Hugging Face safetensors directory without a held-out task to score (the
    LM merge zoo's models are scored on their texts, which needs them loaded): those merges can stream."""
    import json

    from toolkit.merge.models import PLAIN_KEY
    from toolkit.models.lazy import is_safetensors_dir

    for spec in specs:
        if not is_safetensors_dir(spec):
            return False
        try:
            config = json.loads((Path(spec) / "config.json").read_text())
        except ValueError:
            return False
        if PLAIN_KEY in config or ((config.get("iclrkit") or {}).get("task") or {}).get("heldout"):
            return False
    return True


def method_of(name: str, *, tensorwise: bool = True):
    """The registered merge method `name` (kind "merge"); a tensor-by-tensor one unless `tensorwise=False`."""
    from toolkit.core.registry import registry

    method = registry("merge").get(name)
    if tensorwise and not method.meta.get("tensorwise"):
        raise BadInputError(f"merge method '{name}' does not merge tensor by tensor",
                            f"run `iclrkit merge {name}`")
    return method


def merge_states(name: str, states: list[dict[str, torch.Tensor]], base: dict[str, torch.Tensor] | None,
                 options: MergeOptions) -> dict[str, torch.Tensor]:
    """The in-memory merge by the registered method `name`: its tensor function over every tensor (the base's
    names when it needs a base, else the first model's), shapes checked first."""
    from toolkit.merge import baselines

    method = method_of(name)
    if method.needs_base:
        require(base is not None, f"merge method '{name}' needs a base model")
    everyone = states + ([base] if method.needs_base else [])
    baselines.check_shapes(everyone)
    prepare = method.meta.get("prepare")
    options = prepare(options, len(states)) if prepare else options
    names = base if method.needs_base else states[0]
    return {n: method.obj([s[n] for s in states], base[n] if method.needs_base else None, options) for n in names}


def stream_merge(ctx, name: str, specs: list[str], base_spec: str | None, technique: str, paper: str,
                 metadata: dict, *, options: MergeOptions, dtype: str = "auto",
                 max_shard_bytes: int | None = None) -> None:
    """The registered tensor-by-tensor method `name` (average, task-arithmetic, ties, ...) read tensor by tensor
    (safetensors; row chunks for the elementwise, `rowwise` methods) and written into the output shards as they
    are made, in the inputs' dtype unless `dtype` says; peak memory is a few tensors (TIES: a few float64 copies
    of the largest tensor, its top-k is global)."""
    import json

    from toolkit.models.lazy import SafetensorsIndex
    from toolkit.models.save import CARD
    from toolkit.models.shards import ShardWriter, copy_model_files

    method = method_of(name)
    require(len(specs) >= 2, "a merge needs at least two models")
    require(dtype == "auto" or dtype in DTYPES, f"dtype must be auto, {', '.join(DTYPES)}; got {dtype!r}")
    require(base_spec is not None or not method.needs_base, f"merge method '{name}' needs a base model")
    inputs = [SafetensorsIndex(spec) for spec in specs]
    base = SafetensorsIndex(base_spec) if method.needs_base else None
    template = base or inputs[0]
    everyone = inputs + ([base] if base is not None else [])
    types = {json.loads((i.directory / "config.json").read_text()).get("model_type") for i in everyone}
    require(len(types) == 1, f"models of incompatible families cannot be merged: {sorted(map(str, types))}")
    names = template.names()
    for index in everyone:
        require(set(index.names()) == set(names), f"{index.directory} and {template.directory} have different "
                "parameter names: not one architecture family")
        for tensor_name in names:
            require(index.shape_of[tensor_name] == template.shape_of[tensor_name],
                    f"'{tensor_name}' has shapes {template.shape_of[tensor_name]} and {index.shape_of[tensor_name]}: "
                    "models of different sizes", hint="use `iclrkit merge padded` or `iclrkit merge latent run`")
    prepare = method.meta.get("prepare")
    options = prepare(options, len(inputs)) if prepare else options
    out_dtype = template.dtype if dtype == "auto" else DTYPES[dtype]
    layout = [(n, out_dtype if template.dtype_of[n].is_floating_point else template.dtype_of[n],
               template.shape_of[n]) for n in names]
    out = ctx.path("model")
    writer = ShardWriter(out, layout, max_shard_bytes or STREAM_SHARD_BYTES)

    def read(index, tensor_name, rows=None):
        tensor = index.get(tensor_name) if rows is None else index.get_rows(tensor_name, *rows)
        if tensor.is_floating_point() and not torch.isfinite(tensor).all():
            raise BadInputError(f"{index.directory}: weight '{tensor_name}' contains NaN or Inf")
        return tensor

    def merge(tensor_name, rows=None):
        tensors = [read(i, tensor_name, rows) for i in inputs]
        reference = read(base, tensor_name, rows) if base is not None else None
        floating = (reference if reference is not None else tensors[0]).is_floating_point()
        return method.obj(tensors, reference, options, out_dtype if floating else None)

    try:
        for name in names:
            shape = template.shape_of[name]
            row = 1
            for dim in shape[1:]:
                row *= dim
            if method.rowwise and len(shape) >= 1 and shape[0] * row > STREAM_CHUNK:
                step = max(1, STREAM_CHUNK // max(row, 1))
                merged = torch.cat([merge(name, (r, min(r + step, shape[0]))) for r in range(0, shape[0], step)])
            else:
                merged = merge(name)
            require(not merged.is_floating_point() or bool(torch.isfinite(merged).all()),
                    f"the merge produced NaN/Inf in '{name}'")
            writer.add({name: merged})
            del merged
        writer.close()
    except BaseException:
        writer.abort()
        for folder in (out, out.parent):  # leave nothing behind (the run directory too, when this made it)
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
        raise
    meta = {"technique": technique, "parents": [str(s) for s in specs], **metadata}
    copy_model_files(template.directory, out, {"iclrkit": meta}, dtype=out_dtype)
    (out / "README.md").write_text(CARD.format(title=f"{technique}: merged", technique=technique,
                                               source=" + ".join(str(s) for s in specs), paper=paper or "-",
                                               command=command_line(),
                                               notes="Streamed merge (one tensor at a time)."))
    ctx.metrics.update({"n_models": len(inputs), "streamed": True,
                        "dtype": str(out_dtype).removeprefix("torch."), "bytes_written": writer.total_bytes})
