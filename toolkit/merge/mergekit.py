"""mergekit YAML configs (github.com/arcee-ai/mergekit) translated to iclrkit's weight-space merges.

Supported `merge_method`s and the semantics matched (mergekit's merge_methods/linear.py and
generalized_task_arithmetic.py):
- linear: Σ wᵢ θᵢ / Σ wᵢ (`normalize`, default true) = `iclrkit merge average --weights`.
- task_arithmetic: θ_base + λ Σ wᵢ τᵢ, divided by Σ wᵢ when `normalize` (default false here) =
  `iclrkit merge task-arithmetic --scaling λ·w` when every weight is the same w; per-model weights otherwise.
- ties: each τᵢ trimmed to its top int(densityᵢ·n) magnitudes, sign elected per entry by the sum of the weighted
  trimmed τ, then the agreeing entries' weighted sum divided by their summed weights (`normalize`, default true),
  times λ = `iclrkit merge ties --density d --scaling λ` when weights and densities are the same for every model.
`base_model` may also appear under `models` (its task vector is zero; mergekit skips it, so do we). `dtype` /
`out_dtype` set the saved dtype (iclrkit computes in float64, mergekit in `dtype`: equal up to that rounding).
`int8_mask` only changes mergekit's memory use: ignored with a note. Anything else mergekit has (slices, gradient
or filtered parameters, LoRA `model+lora` specs, other methods) is refused with one line rather than half-applied.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import Field

from toolkit.core.config import BaseConfig
from toolkit.core.errors import BadInputError
from toolkit.merge.config import MergeOptions

SUPPORTED = ("linear", "task_arithmetic", "ties")
PAPERS = {"linear": "https://arxiv.org/abs/2203.05482", "task_arithmetic": "https://arxiv.org/abs/2212.04089",
          "ties": "https://arxiv.org/abs/2306.01708"}
DTYPES = {"float32": "float32", "fp32": "float32", "float16": "float16", "fp16": "float16", "half": "float16",
          "bfloat16": "bfloat16", "bf16": "bfloat16"}
NORMALIZE_DEFAULT = {"linear": True, "task_arithmetic": False, "ties": True}
GLOBAL_PARAMETERS = {"weight", "density", "normalize", "int8_mask", "lambda"}
IGNORED_TOP = {"tokenizer_source", "tokenizer", "chat_template", "name", "base_model_revision"}


class MergekitConfig(BaseConfig):
    """A mergekit config, translated (one list entry per merged model, the base model excluded)."""

    merge_method: Literal["linear", "task_arithmetic", "ties"]
    models: list[str] = Field(default_factory=list)
    weights: list[float] | None = Field(None, description="Per-model weights; None: all the same (folded into "
                                                            "scaling) so the merge is the plain iclrkit one.")
    densities: list[float] | None = Field(None, description="Per-model TIES densities; None: `density` for all.")
    density: float = Field(1.0, gt=0.0, le=1.0)
    base: str | None = None
    scaling: float = 1.0
    normalize: bool = True
    dtype: Literal["float32", "float16", "bfloat16"] | None = None
    source: str = Field("", description="The mergekit YAML this was translated from.")


@dataclass
class Translation:
    config: MergekitConfig
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


def _scalar(value, name: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadInputError(f"{where}: parameter '{name}' = {value!r} is not a number",
                            "gradient (list) and filtered (dict) parameters are not supported")
    return float(value)


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


def translate(data: dict, yaml_text: str = "", source: str = "") -> Translation:
    """mergekit config dict -> the iclrkit merge computing it; every ignored key is named in `notes`."""
    method = data.get("merge_method")
    if method not in SUPPORTED:
        raise BadInputError(f"mergekit merge_method '{method}' is not supported",
                            f"supported: {', '.join(SUPPORTED)}")
    if "slices" in data:
        raise BadInputError("mergekit 'slices' (layer ranges per model) are not supported",
                            "give whole models under 'models'")
    notes = [f"ignored '{key}'" for key in sorted(IGNORED_TOP & set(data))]
    unknown = set(data) - {"merge_method", "models", "base_model", "parameters", "dtype", "out_dtype"} - IGNORED_TOP
    if unknown:
        raise BadInputError(f"mergekit config key(s) iclrkit cannot translate: {', '.join(sorted(unknown))}")
    top = data.get("parameters") or {}
    if not isinstance(top, dict):
        raise BadInputError("mergekit 'parameters' must be a mapping")
    unknown = set(top) - GLOBAL_PARAMETERS
    if unknown:
        raise BadInputError(f"mergekit parameter(s) not supported for {method}: {', '.join(sorted(unknown))}")
    if "int8_mask" in top:
        notes.append("ignored 'int8_mask' (a mergekit memory saving; the merged values do not change)")
    base = data.get("base_model")
    if base is not None and not isinstance(base, str):
        raise BadInputError("mergekit base_model must be a model name")
    if method != "linear" and not base:
        raise BadInputError(f"mergekit {method} needs a base_model")
    if method == "linear" and base:
        notes.append("linear ignores base_model (as mergekit does)")
    entries = data.get("models")
    if not isinstance(entries, list) or not entries:
        raise BadInputError("mergekit config has no 'models' list")
    models, weights, densities = [], [], []
    for index, entry in enumerate(entries):
        name, params = _model_name(entry, index)
        where = f"mergekit models[{index}] ({name})"
        if method != "linear" and name == base:
            continue  # its task vector is zero: mergekit skips the base model
        unknown = set(params) - {"weight", "density"}
        if unknown or (method != "ties" and "density" in params):
            raise BadInputError(f"{where}: parameter(s) not supported for {method}: "
                                f"{', '.join(sorted(unknown or {'density'}))}")
        if "weight" not in params and "weight" not in top:
            raise BadInputError(f"{where}: no 'weight' (mergekit requires one per model)")
        models.append(name)
        weights.append(_scalar(params.get("weight", top.get("weight")), "weight", where))
        densities.append(_scalar(params.get("density", top.get("density", 1.0)), "density", where))
    for index, name in enumerate(models):
        _check_model(name, f"mergekit models[{index}]")
    if base:
        _check_model(base, "mergekit base_model")
    if len(models) < 2 and method == "linear":
        raise BadInputError("a linear merge needs at least two models")
    if not models:
        raise BadInputError(f"mergekit {method} lists no models besides the base model")
    if any(not 0.0 < d <= 1.0 for d in densities):
        raise BadInputError(f"mergekit densities must be in (0, 1], got {densities}")
    normalize = top.get("normalize", NORMALIZE_DEFAULT[method])
    if not isinstance(normalize, bool):
        raise BadInputError(f"mergekit 'normalize' must be true or false, got {normalize!r}")
    lam = _scalar(top.get("lambda", 1.0), "lambda", "mergekit parameters")
    raw_dtype = data.get("out_dtype", data.get("dtype"))
    if raw_dtype is not None and raw_dtype not in DTYPES:
        raise BadInputError(f"mergekit dtype '{raw_dtype}' is not supported", "float32 | float16 | bfloat16")
    dtype = DTYPES.get(raw_dtype) if raw_dtype else None
    values: dict = {"merge_method": method, "models": models, "base": base if method != "linear" else None,
                    "normalize": normalize, "dtype": dtype, "source": source}
    uniform = len(set(weights)) == 1
    if method == "linear":
        if "lambda" in top:
            raise BadInputError("mergekit 'lambda' applies to task_arithmetic / ties, not linear")
        total = sum(weights)
        if not normalize and abs(total - 1.0) > 1e-12:
            raise BadInputError("linear with normalize: false and weights not summing to 1 is not supported",
                                "iclrkit's average normalises the weights")
        if any(w < 0 for w in weights) or total <= 0:
            raise BadInputError(f"linear merge weights must be >= 0 and not all zero, got {weights}")
        values["weights"] = weights
        equivalent = _command("average", models, weights=weights)
    elif method == "task_arithmetic":
        divisor = sum(weights) if normalize and abs(sum(weights)) >= 1e-8 else 1.0
        if uniform:
            values["scaling"] = lam * weights[0] / divisor
            equivalent = (_command("task-arithmetic", models, base=base, scaling=values["scaling"])
                          if values["scaling"] >= 0 else None)
        else:
            values.update(weights=[w / divisor for w in weights], scaling=lam)
            equivalent = None
    else:
        values.update(scaling=lam)
        same_density = len(set(densities)) == 1
        if same_density:
            values["density"] = densities[0]
        else:
            values["densities"] = densities
        if uniform and same_density and normalize and weights[0] > 0:
            equivalent = _command("ties", models, base=base, density=densities[0], scaling=lam) if lam >= 0 else None
        else:
            values["weights"] = weights
            equivalent = None
    if dtype:
        notes.append(f"tensors cast to {dtype} after the merge (computed in float64, as the iclrkit merges are)")
    return Translation(MergekitConfig(**values), yaml_text, equivalent, notes)


def _command(name: str, models: list[str], weights=None, base=None, scaling=None, density=None) -> str:
    parts = ["iclrkit", "merge", name, "-m", ",".join(models)]
    if weights is not None:
        parts += ["--weights", ",".join(repr(float(w)) for w in weights)]
    if base is not None:
        parts += ["--base", base]
    if density is not None:
        parts += ["--density", repr(float(density))]
    if scaling is not None:
        parts += ["--scaling", repr(float(scaling))]
    return shlex.join(parts)


def method_for(merge_method: str):
    """The registered merge method (kind "merge") computing mergekit's `merge_method`."""
    from toolkit.core.registry import registry

    for method in registry("merge"):
        if method.meta.get("mergekit") == merge_method:
            return method
    raise BadInputError(f"mergekit merge_method '{merge_method}' is not supported", f"supported: {', '.join(SUPPORTED)}")


def technique_of(merge_method: str) -> str:
    """The iclrkit technique (command) a mergekit method runs as: merge.average for linear, ..."""
    return f"merge.{method_for(merge_method).name}"


def merged_state(config: MergekitConfig, parents, base):
    """The merged state dict by the registered method mergekit's `merge_method` names, with the translated
    options: with uniform weights (weights None) the very call the plain iclrkit merge makes."""
    from toolkit.merge.common import merge_states

    method = method_for(config.merge_method)
    options = MergeOptions(weights=config.weights, scaling=config.scaling, density=config.density,
                           densities=config.densities, normalize=config.normalize)
    return merge_states(method.name, [p.state for p in parents], base.state if method.needs_base else None, options)


def run_mergekit(config: MergekitConfig, ctx, translation: Translation, command: str) -> None:
    """Load, merge, save (model card with the real command and the mergekit YAML), score like `finish`."""
    import torch

    from toolkit.core.errors import require
    from toolkit.merge.common import load_parents, parent_tasks, pick_target
    from toolkit.merge.evaluate import evaluate
    from toolkit.merge.models import like, save_plain, untied_state

    parents = load_parents(config.models, ctx.device) if len(config.models) > 1 else _one(config.models[0], ctx)
    base = pick_target(parents, config.base, ctx.device) if config.base else parents[0]
    state = merged_state(config, parents, base)
    if config.dtype:
        dtype = getattr(torch, config.dtype)
        state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
    for name, tensor in state.items():
        require(not tensor.is_floating_point() or bool(torch.isfinite(tensor).all()),
                f"the merge produced NaN/Inf in '{name}'")
    technique = technique_of(config.merge_method)
    merged = like(base, state)
    out = ctx.path("model")
    meta = {"technique": technique, "parents": [p.source for p in parents], "mergekit": config.source}
    if merged.hf_model is None:
        save_plain(merged, out, metadata=meta)
    else:
        from toolkit.models.save import save_model

        model = merged.hf_model
        if config.dtype:
            model.to(getattr(torch, config.dtype))
        missing, unexpected = model.load_state_dict(state, strict=False)
        tied = set(model.state_dict()) - set(untied_state(model))
        require(not unexpected and set(missing) <= tied, f"merged state does not fit the model: missing "
                f"{missing[:3]}, unexpected {unexpected[:3]}")
        notes = "Translated from this mergekit config:\n\n```yaml\n" + translation.yaml_text.rstrip() + "\n```\n"
        if translation.equivalent:
            notes += f"\nThe same merge as iclrkit command: `{translation.equivalent}`\n"
        save_model(model, merged.tokenizer, out, technique=technique, source=" + ".join(p.source for p in parents),
                   paper=PAPERS[config.merge_method], command=command, notes=notes, metadata=meta)
    ctx.path("model/mergekit_config.yml").write_text(translation.yaml_text)
    task_a, task_b = parent_tasks(parents) if len(parents) > 1 else (parents[0].task, None)
    ctx.metrics.update(evaluate(merged, task_a, task_b))
    for index, parent in enumerate(parents):
        scores = evaluate(parent, task_a, task_b)
        if scores:
            ctx.baselines[f"parent{index}"] = scores
    ctx.metrics.update({"n_models": len(parents), "merge_method": config.merge_method,
                        "equivalent_command": translation.equivalent or "", "notes": translation.notes})


def _one(spec: str, ctx):
    """task_arithmetic / ties of a single fine-tuned model and its base (load_parents wants two)."""
    from toolkit.merge.models import load_for_merge

    return [load_for_merge(spec, ctx.device)]
