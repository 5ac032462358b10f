"""mergekit YAML configs (github.com/arcee-ai/mergekit) translated to iclrkit's registered merges.

Which `merge_method`s are supported, and how their parameters map onto the iclrkit config, is each method's own
registration (toolkit/merge/methods/): `mergekit="ties"`, `mergekit_params={"density": ("densities", "model"),
"lambda": ("scaling", "global"), ...}` ("model": one value per non-base model, from the model's `parameters` or
the top-level ones; "same": per model too, but every model must give the same value; "global": top-level only; a
field of None: accepted and ignored with a note, e.g. int8_mask), and optionally `mergekit_fold` (rewrites the
translated values, e.g. uniform task-arithmetic weights folded into λ so the run is the plain iclrkit command) and
`mergekit_slices` (the method takes mergekit's `slices`, e.g. passthrough). So a method registered with
`mergekit="slerp"` is translated with no edit here.

Semantics follow mergekit 0.1.5: `base_model` listed under `models` is skipped for methods that take a base;
parameters may be gradients (lists interpolated over the layers); a parameter mergekit defaults (density 1,
lambda 1, normalize/rescale per method) gets mergekit's default, not iclrkit's. `dtype` / `out_dtype` set the saved
dtype; iclrkit computes in float64 unless `--numerics mergekit` (then in `dtype`, as mergekit). `tokenizer_source:
base` is what iclrkit does for a method with a base (the base's tokenizer is copied); any other tokenizer source,
filtered (dict) parameters, LoRA `model+lora` specs and unknown keys are refused with one line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from toolkit.core.errors import BadInputError
from toolkit.core.registry import Entry

DTYPES = {"float32": "float32", "fp32": "float32", "float16": "float16", "fp16": "float16", "half": "float16",
          "bfloat16": "bfloat16", "bf16": "bfloat16"}
TOP_KEYS = {"merge_method", "models", "slices", "base_model", "parameters", "dtype", "out_dtype", "tokenizer_source",
            "tokenizer", "chat_template", "name", "base_model_revision"}
IGNORED_TOP = {"chat_template", "name", "base_model_revision"}
HOW = ("dtype", "out_dtype")  # how a merge is computed and saved, not which merge: left out of the equivalent command


@dataclass
class Translation:
    entry: Entry  # the registered iclrkit method
    config: Any  # its config, translated
    merge_method: str
    yaml_text: str
    equivalent: str | None  # the iclrkit command computing the same tensors, when one exists
    notes: list[str] = field(default_factory=list)


def is_mergekit(data: dict) -> bool:
    return isinstance(data, dict) and "merge_method" in data


def read(path: str | Path) -> tuple[dict, str]:
    from toolkit.core.config import load_yaml

    data = load_yaml(path)
    if not is_mergekit(data):
        raise BadInputError(f"{path} is not a mergekit config (no 'merge_method' key)")
    return data, Path(path).read_text()


def supported() -> dict[str, Entry]:
    """mergekit merge_method -> the registered iclrkit method computing it (from the registry's metadata)."""
    import toolkit.merge.config  # noqa: F401 - declares the registry's method modules
    from toolkit.core.registry import registry

    return {e.meta["mergekit"]: e for e in registry("merge") if e.meta.get("mergekit")}


def method_for(merge_method: str) -> Entry:
    methods = supported()
    if merge_method not in methods:
        raise BadInputError(f"mergekit merge_method '{merge_method}' is not supported",
                            f"supported: {', '.join(sorted(methods))}")
    return methods[merge_method]


def technique_of(merge_method: str) -> str:
    """The iclrkit technique (command) a mergekit method runs as: merge.average for linear, ..."""
    return f"merge.{method_for(merge_method).name}"


def _setting(value, name: str, where: str):
    """A parameter value: a number (or bool), or a gradient (a list of numbers); filtered (dict) ones are refused."""
    if isinstance(value, bool) or isinstance(value, (int, float)):
        return value if isinstance(value, bool) else float(value)
    if isinstance(value, list) and value and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                 for v in value):
        return [float(v) for v in value]
    raise BadInputError(f"{where}: parameter '{name}' = {value!r} is not a number or a gradient (list of numbers)",
                        "filtered (dict) parameters are not supported")


def _model_name(entry, index: int) -> tuple[str, dict]:
    if isinstance(entry, str):
        return entry, {}
    if not isinstance(entry, dict) or not isinstance(entry.get("model"), str):
        raise BadInputError(f"mergekit models[{index}] needs a 'model' name")
    params = entry.get("parameters") or {}
    if not isinstance(params, dict):
        raise BadInputError(f"mergekit models[{index}].parameters must be a mapping")
    return entry["model"], params


def _check_model(spec: str, where: str) -> None:
    """Local paths must exist; `org/name` hub ids and zoo:NAME are left to the loader."""
    if spec.startswith("zoo:") or Path(spec).expanduser().exists():
        return
    if "+" in spec:
        raise BadInputError(f"{where}: '{spec}' names a LoRA ('model+lora'), which iclrkit's merge cannot apply")
    if spec.startswith((".", "/", "~")) or spec.count("/") > 1 or "\\" in spec:
        raise BadInputError(f"{where}: model not found: {spec}")


def _top(data: dict, method: str, entry: Entry, notes: list[str]) -> dict:
    """The top-level keys checked (tokenizer included) and the top-level parameters."""
    unknown = set(data) - TOP_KEYS
    if unknown:
        raise BadInputError(f"mergekit config key(s) iclrkit cannot translate: {', '.join(sorted(unknown))}")
    notes += [f"ignored '{key}'" for key in sorted(IGNORED_TOP & set(data))]
    if "tokenizer" in data:
        raise BadInputError("mergekit 'tokenizer' (vocabulary surgery) is not supported",
                            "merge models that share a tokenizer, without a 'tokenizer' section")
    source = data.get("tokenizer_source")
    if source is not None and not (source == "base" and entry.needs_base):
        raise BadInputError(f"mergekit tokenizer_source '{source}' is not supported",
                            "iclrkit copies the base model's tokenizer (tokenizer_source: base) and cannot build a "
                            "union vocabulary: drop the key for models that share a tokenizer")
    top = data.get("parameters") or {}
    if not isinstance(top, dict):
        raise BadInputError("mergekit 'parameters' must be a mapping")
    unknown = set(top) - set(entry.meta.get("mergekit_params", {}))
    if unknown:
        raise BadInputError(f"mergekit parameter(s) not supported for {method}: {', '.join(sorted(unknown))}")
    return top


def _models(data: dict, method: str, entry: Entry, top: dict, notes: list[str]) -> dict:
    """The translated values of a `models:` config: models, base, per-model and global parameters."""
    base = data.get("base_model")
    if base is not None and not isinstance(base, str):
        raise BadInputError("mergekit base_model must be a model name")
    if entry.needs_base and not base:
        raise BadInputError(f"mergekit {method} needs a base_model")
    if base and not entry.needs_base:
        notes.append(f"{method} ignores base_model (as mergekit does)")
    if "slices" in data:
        raise BadInputError(f"mergekit 'slices' (layer ranges per model) are not supported for {method}",
                            "give whole models under 'models' (slices: merge_method passthrough)")
    models, per = _per_model(data.get("models"), method, entry, top, base)
    least = entry.meta.get("min_models", 2)
    if len(models) < least:
        raise BadInputError(f"a {method} merge needs at least {least} models" if least > 1 else
                            f"mergekit {method} lists no models besides the base model")
    values: dict = {"models": models, **({"base": base} if entry.needs_base else {})}
    for p, (name, scope) in entry.meta.get("mergekit_params", {}).items():
        if name is None:
            if p in top:
                notes.append(f"ignored '{p}' (a mergekit memory saving; the merged values do not change)")
        elif scope == "global" and p in top:
            values[name] = _setting(top[p], p, "mergekit parameters")
        elif scope == "model":
            if p == "density" and not per[p]:
                per[p] = [1.0] * len(models)  # mergekit's default density
            if per[p]:
                values[name] = per[p]
        elif scope == "same" and per[p]:
            if len({repr(v) for v in per[p]}) != 1:
                raise BadInputError(f"mergekit {method}: per-model '{p}' values differ ({per[p]})",
                                    f"iclrkit takes one {p} for every model")
            values[name] = per[p][0]
    fold = entry.meta.get("mergekit_fold")
    return fold(values, values.pop("weights", None)) if fold else values


def _per_model(listed, method: str, entry: Entry, top: dict, base: str | None) -> tuple[list[str], dict]:
    """(the merged models, {per-model parameter: its value for each}) from `models:` (the base skipped for a method
    with a base, as mergekit does); a per-model parameter may come from the top-level `parameters`."""
    if not isinstance(listed, list) or not listed:
        raise BadInputError("mergekit config has no 'models' list")
    per_model = [p for p, (_, scope) in entry.meta.get("mergekit_params", {}).items() if scope in ("model", "same")]
    models, per = [], {p: [] for p in per_model}
    for index, item in enumerate(listed):
        name, params = _model_name(item, index)
        where = f"mergekit models[{index}] ({name})"
        if entry.needs_base and name == base:
            continue  # its task vector is zero: mergekit skips the base model
        unknown = set(params) - set(per_model)
        if unknown:
            raise BadInputError(f"{where}: parameter(s) not supported for {method}: {', '.join(sorted(unknown))}")
        for p in per_model:
            value = params.get(p, top.get(p))
            if value is None and p == "weight":
                raise BadInputError(f"{where}: no 'weight' (mergekit requires one per model)")
            if value is not None:
                per[p].append(_setting(value, p, where))
        models.append(name)
    for index, name in enumerate(models):
        _check_model(name, f"mergekit models[{index}]")
    if base and entry.needs_base:
        _check_model(base, "mergekit base_model")
    return models, per


def _slices(data: dict, method: str, entry: Entry, top: dict) -> dict:
    """The translated values of a `slices:` config (passthrough)."""
    if "models" in data or "base_model" in data:
        raise BadInputError(f"mergekit {method}: give the blocks under 'slices' (no 'models' / 'base_model')")
    slices = data.get("slices")
    if not isinstance(slices, list) or not slices:
        raise BadInputError(f"mergekit {method} needs a 'slices' list")
    out = []
    for index, item in enumerate(slices):
        sources = item.get("sources") if isinstance(item, dict) else None
        if not isinstance(sources, list) or len(sources) != 1:
            raise BadInputError(f"mergekit slices[{index}]: {method} takes exactly one source per slice")
        source = sources[0]
        params = source.get("parameters") or {}
        unknown = set(source) - {"model", "layer_range", "parameters"} or set(params) - {"scale"}
        if unknown:
            raise BadInputError(f"mergekit slices[{index}]: not supported: {', '.join(sorted(unknown))}")
        _check_model(str(source.get("model")), f"mergekit slices[{index}]")
        scale = params.get("scale", top.get("scale"))
        out.append({"sources": [{"model": source.get("model"), "layer_range": source.get("layer_range"),
                                 "scale": None if scale is None else _setting(scale, "scale", f"slices[{index}]")}]})
    return {"slices": out}


def translate(data: dict, yaml_text: str = "", source: str = "", numerics: str = "float64") -> Translation:
    """mergekit config dict -> the registered iclrkit merge computing it; every ignored key is named in `notes`."""
    method = data.get("merge_method")
    entry = method_for(method)
    notes: list[str] = []
    top = _top(data, method, entry, notes)
    values = _slices(data, method, entry, top) if entry.meta.get("mergekit_slices") else \
        _models(data, method, entry, top, notes)
    raw_dtype, compute = data.get("out_dtype", data.get("dtype")), data.get("dtype")
    for raw in (raw_dtype, compute):
        if raw is not None and raw not in DTYPES:
            raise BadInputError(f"mergekit dtype '{raw}' is not supported", "float32 | float16 | bfloat16")
    if raw_dtype:
        values["dtype"] = DTYPES[raw_dtype]
    values["numerics"] = numerics
    if numerics == "mergekit" and compute:
        values["compute_dtype"] = DTYPES[compute]
    try:
        config = entry.config(method=entry.name, **values)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise BadInputError(f"mergekit {method}: {'.'.join(map(str, first['loc']))}: {first['msg']}") from None
    if raw_dtype and numerics != "mergekit":
        notes.append(f"tensors cast to {values['dtype']} after the merge (computed in float64, as the iclrkit merges "
                     "are; --numerics mergekit computes in the models' dtype as mergekit does)")
    return Translation(entry, config, method, yaml_text, equivalent(entry, config), notes)


def equivalent(entry: Entry, config) -> str | None:
    """The plain `iclrkit merge NAME ...` computing the same tensors, or None when a translated value has no flag."""
    import shlex

    if not entry.meta.get("tensorwise"):
        return None
    flags = set(entry.meta.get("flags", ()))
    parts = ["iclrkit", "merge", entry.name, "-m", ",".join(config.models)]
    for name, info in type(config).model_fields.items():
        value = getattr(config, name)
        default = info.get_default(call_default_factory=True)
        if name in ("models", "method", "stream", "numerics", "compute_dtype", "dtype") or value == default:
            continue
        if name not in flags and name != "base":
            return None
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        flag = extra.get("flag", "--" + name.replace("_", "-"))
        if isinstance(value, bool):
            parts.append(flag if value else "--no-" + flag.removeprefix("--"))
        elif isinstance(value, list):
            if any(isinstance(v, list) for v in value) or extra.get("style") != "comma":
                return None
            parts += [flag, ",".join(repr(float(v)) for v in value)]
        else:
            parts += [flag, value if isinstance(value, str) else repr(float(value))]
    return shlex.join(parts)


def run_mergekit(config, ctx, translation: Translation, command: str) -> None:
    """Run the translated method as its own command does, then add the mergekit YAML, the translation notes and
    the equivalent command to the model directory and run.json."""
    from toolkit.merge.weightspace import run_weightspace

    entry = translation.entry
    if entry.meta.get("tensorwise"):
        run_weightspace(config, ctx)
    else:
        entry.obj(config, ctx)
    model = ctx.path("model")
    notes = "\n\nTranslated from this mergekit config:\n\n```yaml\n" + translation.yaml_text.rstrip() + "\n```\n"
    if translation.equivalent:
        notes += f"\nThe same merge as iclrkit command: `{translation.equivalent}`\n"
    card = model / "README.md"
    card.write_text(card.read_text() + notes)
    (model / "mergekit_config.yml").write_text(translation.yaml_text)
    ctx.metrics.update({"merge_method": translation.merge_method, "equivalent_command": translation.equivalent or "",
                        "notes": translation.notes})
