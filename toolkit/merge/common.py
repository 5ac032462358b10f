"""What every merge command shares: loading the parents, saving the merge, scoring digits models, and the one way
a registered tensor-by-tensor method is called (`merge_tensor`), in memory (`merge_states`) and streamed
(`stream_merge`) alike."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from toolkit.core.errors import BadInputError, require
from toolkit.core.records import command_line
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
    return parents[0].task, parents[1].task if len(parents) > 1 else None


def finish(ctx, parents: list[PlainModel], template: PlainModel, state: dict[str, torch.Tensor], technique: str,
           paper: str, metadata: dict, notes: str = "") -> PlainModel:
    """Check, save and score the merge; parents' own scores go to baselines for the summary table."""
    for name, tensor in state.items():
        require(not tensor.is_floating_point() or bool(torch.isfinite(tensor).all()),
                f"the merge produced NaN/Inf in '{name}'")
    merged = like(template, state)
    save_merged(merged, ctx.path("model"), technique, [p.source for p in parents], paper,
                command=command_line(), metadata=metadata, notes=notes)
    task_a, task_b = parent_tasks(parents)
    ctx.metrics.update(evaluate(merged, task_a, task_b))
    for index, parent in enumerate(parents):
        scores = evaluate(parent, task_a, task_b)
        if scores:
            ctx.baselines[f"parent{index}"] = scores
    ctx.metrics["n_models"] = len(parents)
    return merged


# -- the tensor-by-tensor methods: one call, in memory and streamed ---------------------------------------------------

@dataclass(frozen=True)
class Site:
    """Where a tensor sits: its name, its layer position t (block i of L: i/(L−1); tensors outside the blocks: 0,
    as mergekit) and the run's seed. A method reads a knob at this tensor with `at` and draws with `generator`."""

    name: str
    t: float = 0.0
    seed: int = 0

    def at(self, value: Any) -> float:
        """A knob's value here: a number as it is, a gradient (list) interpolated at t as mergekit does."""
        if not isinstance(value, (list, tuple)):
            return value
        scaled = self.t * (len(value) - 1)
        low = int(scaled)
        high = min(len(value) - 1, low + 1)
        frac = scaled - low
        return float((1 - frac) * value[low] + frac * value[high])

    def generator(self, model: int):
        from toolkit.merge.kernels import generator

        return generator(self.seed, self.name, model)


class TensorMethod(Protocol):
    """A registered tensor-by-tensor merge (`@register("merge", NAME, config=..., tensorwise=True, ...)`): one output
    tensor from the models' tensors and the base's (None unless the method `needs_base`), all already in the compute
    dtype (float64, or the models' dtype with numerics=mergekit), reading its knobs from its own config."""

    def __call__(self, tensors: list, base: Any, config: Any, site: Site) -> Any: ...


class MergeCheck(Protocol):
    """Optional `check` metadata: the config against the number of models, once before any tensor is merged."""
    def __call__(self, config: Any, n_models: int) -> None: ...


LAYER = re.compile(r"(?:^|\.)(?:layers|h|blocks|layer)\.(\d+)\.")


def layer_positions(names: list[str]) -> dict[str, float]:
    """t of every tensor name: i/(L−1) for block i of L (1 with a single block), 0 outside the blocks."""
    found = {n: int(m.group(1)) for n in names if (m := LAYER.search(n))}
    count = max(found.values()) + 1 if found else 0
    return {n: (found[n] / (count - 1) if count > 1 else 1.0) if n in found else 0.0 for n in names}


def per_model(values: list | None, n: int, what: str) -> None:
    """The one check of a per-model list's length (weights, densities, ...)."""
    if values is not None:
        require(len(values) == n, f"{len(values)} {what} for {n} models")


def nonnegative_weights(weights: list | None) -> None:
    """The one check of weights that are normalised (averages, latent interpolation): >= 0 and not all zero."""
    if weights is not None:
        values = [v for w in weights for v in (w if isinstance(w, list) else [w])]
        require(all(v >= 0 for v in values) and sum(values) > 0, "merge weights must be >= 0 and not all zero")


def check_config(method, config, n: int) -> None:
    """Everything a merge checks once, before any tensor: per-model lists, the method's own `check`."""
    require(n >= 1, "a merge needs at least one model")
    per_model(getattr(config, "weights", None), n, "merge weights")
    per_model(getattr(config, "densities", None), n, "densities")
    check = method.meta.get("check")
    if check is not None:
        check(config, n)


def compute_dtype(config, out_dtype: torch.dtype) -> torch.dtype:
    """float64 (the default numerics), or with numerics=mergekit the dtype mergekit computes in: `compute_dtype`,
    else the output dtype."""
    if getattr(config, "numerics", "float64") != "mergekit":
        return torch.float64
    chosen = getattr(config, "compute_dtype", "auto")
    return out_dtype if chosen == "auto" else DTYPES[chosen]


def merge_tensor(method, tensors: list[torch.Tensor], base: torch.Tensor | None, config, site: Site,
                 out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """The one call of a tensor-by-tensor method (in memory and streamed): a non-float tensor is the base's (else
    the first model's); a float one is merged in the compute dtype and cast to `out_dtype` (default: its own)."""
    reference = base if base is not None else tensors[0]
    if not reference.is_floating_point():
        return reference.clone()
    out_dtype = out_dtype or reference.dtype
    dtype = compute_dtype(config, out_dtype)
    merged = method.obj([t.to(dtype) for t in tensors], base.to(dtype) if base is not None else None, config, site)
    return merged.to(out_dtype)


def merge_states(config, states: list[dict[str, torch.Tensor]], base: dict[str, torch.Tensor] | None,
                 seed: int = 0) -> dict[str, torch.Tensor]:
    """The in-memory merge by the registered method `config.method`: its tensor function over every tensor (the
    base's names when it needs a base, else the first model's), shapes checked first."""
    from toolkit.merge import baselines

    method = method_of(config.method)
    if method.needs_base:
        require(base is not None, f"merge method '{config.method}' needs a base model")
    everyone = states + ([base] if method.needs_base else [])
    baselines.check_shapes(everyone)
    check_config(method, config, len(states))
    names = list(base if method.needs_base else states[0])
    where = layer_positions(names)
    return {n: merge_tensor(method, [s[n] for s in states], base[n] if method.needs_base else None, config,
                            Site(n, where[n], seed)) for n in names}


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
    import toolkit.merge.config  # noqa: F401 - declares the registry's method modules
    from toolkit.core.registry import registry

    method = registry("merge").get(name)
    if tensorwise and not method.meta.get("tensorwise"):
        raise BadInputError(f"merge method '{name}' does not merge tensor by tensor",
                            f"run `iclrkit merge {name}`")
    return method


def open_inputs(specs: list[str], base_spec: str | None, needs_base: bool, name: str):
    """(model indexes, base index or None) of a streamed merge: one family, the same names and shapes."""
    import json

    from toolkit.models.lazy import SafetensorsIndex

    require(base_spec is not None or not needs_base, f"merge method '{name}' needs a base model")
    inputs = [SafetensorsIndex(spec) for spec in specs]
    base = SafetensorsIndex(base_spec) if needs_base else None
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
    return inputs, base


def read_finite(index, tensor_name: str, rows: tuple[int, int] | None = None) -> torch.Tensor:
    tensor = index.get(tensor_name) if rows is None else index.get_rows(tensor_name, *rows)
    if tensor.is_floating_point() and not torch.isfinite(tensor).all():
        raise BadInputError(f"{index.directory}: weight '{tensor_name}' contains NaN or Inf")
    return tensor


def write_streamed(out: Path, layout: list, tensors, max_shard_bytes: int | None) -> int:
    """Write (name, tensor) pairs from the iterator `tensors` into the output shards as they come; on any failure
    nothing is left behind (the run directory neither, when this made it). Returns the bytes written."""
    from toolkit.models.shards import ShardWriter

    writer = ShardWriter(out, layout, max_shard_bytes or STREAM_SHARD_BYTES)
    try:
        for name, merged in tensors:
            require(not merged.is_floating_point() or bool(torch.isfinite(merged).all()),
                    f"the merge produced NaN/Inf in '{name}'")
            writer.add({name: merged})
            del merged
        writer.close()
    except BaseException:
        writer.abort()
        for folder in (out, out.parent):
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
        raise
    return writer.total_bytes


def write_card(out: Path, template_dir: Path, specs: list[str], technique: str, paper: str, metadata: dict,
               out_dtype: torch.dtype, notes: str) -> None:
    """config.json (+ tokenizer files) of the template with the merge's record, and the model card."""
    from toolkit.models.save import CARD
    from toolkit.models.shards import copy_model_files

    meta = {"technique": technique, "parents": [str(s) for s in specs], **metadata}
    copy_model_files(template_dir, out, {"iclrkit": meta}, dtype=out_dtype)
    (out / "README.md").write_text(CARD.format(title=f"{technique}: merged", technique=technique,
                                               source=" + ".join(str(s) for s in specs), paper=paper or "-",
                                               command=command_line(), notes=notes))


def numerics_note(config) -> str:
    """What the model card says about how the merge was computed."""
    if getattr(config, "numerics", "float64") == "mergekit":
        return "Computed as mergekit 0.1.5 does (numerics=mergekit: in the models' dtype, its order of operations)."
    return "Computed in float64 and rounded once to the output dtype (numerics=float64, the default)."


def stream_merge(ctx, config, specs: list[str], base_spec: str | None, technique: str, paper: str,
                 metadata: dict, *, max_shard_bytes: int | None = None) -> None:
    """The registered tensor-by-tensor method `config.method` read tensor by tensor (safetensors; row chunks for
    the elementwise, `rowwise` methods) and written into the output shards as they are made, in the inputs' dtype
    unless `config.dtype` says; peak memory is a few tensors (TIES: a few float64 copies of the largest tensor, its
    top-k is global)."""
    method = method_of(config.method)
    least = method.meta.get("min_models", 2)
    require(len(specs) >= least, "a merge needs at least two models" if least == 2 else
            f"merge method '{method.name}' needs at least {least} model(s) besides the base")
    dtype = getattr(config, "dtype", "auto")
    require(dtype == "auto" or dtype in DTYPES, f"dtype must be auto, {', '.join(DTYPES)}; got {dtype!r}")
    inputs, base = open_inputs(specs, base_spec, method.needs_base, method.name)
    check_config(method, config, len(inputs))
    template = base or inputs[0]
    out_dtype = template.dtype if dtype == "auto" else DTYPES[dtype]
    names = template.names()
    layout = [(n, out_dtype if template.dtype_of[n].is_floating_point else template.dtype_of[n],
               template.shape_of[n]) for n in names]
    where = layer_positions(names)

    def merge(name, rows=None):
        tensors = [read_finite(i, name, rows) for i in inputs]
        reference = read_finite(base, name, rows) if base is not None else None
        return merge_tensor(method, tensors, reference, config, Site(name, where[name], ctx.seed), out_dtype)

    def merged():
        for name in names:
            shape = template.shape_of[name]
            row = math.prod(shape[1:])
            if method.rowwise and len(shape) >= 1 and shape[0] * row > STREAM_CHUNK:
                step = max(1, STREAM_CHUNK // max(row, 1))
                yield name, torch.cat([merge(name, (r, min(r + step, shape[0]))) for r in range(0, shape[0], step)])
            else:
                yield name, merge(name)

    out = ctx.path("model")
    total = write_streamed(out, layout, merged(), max_shard_bytes)
    write_card(out, template.directory, specs, technique, paper, metadata, out_dtype,
               "Streamed merge (one tensor at a time). " + numerics_note(config))
    ctx.metrics.update({"n_models": len(inputs), "streamed": True,
                        "dtype": str(out_dtype).removeprefix("torch."), "bytes_written": total})
