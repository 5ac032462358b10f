"""Compression recipes as stages (llm-compressor's modifiers composed by a recipe). A YAML recipe lists registered
stages in order, each with its knobs:

    stages:
      - smooth: {alpha: 0.5}
      - sparsegpt: {sparsity: 0.5}
      - gptq: {w_bits: 4, actorder: static}

Stages live in the "compress-stage" registry (declared by toolkit/compress/config.py; each stage is registered beside
its method in toolkit/compress/methods/). Their metadata:
- `role`: "transform", a whole-model step before the block pass (`rotate`, `smooth`), called as
  `fn(view, windows, stage_config, run_config, ctx) -> dict` (what the export needs, e.g. {"rotation": ...});
  "prune", which chooses the kept weights (`magnitude`, `wanda` hand their mask on and keep W; `sparsegpt` also
  updates the kept weights by OBS); "quantize" (`gptq`, `rtn`, `obr`: the method's own function, given the mask an
  earlier stage chose). Per-linear stages are toolkit.compress.job.CompressMethod: `fn(job) -> (W, keep, grid)`.
- `knobs`: the config fields a recipe may set on the stage; the rest of the stage's config comes from the run's
  shared fields (model, data, calibration, a_bits, ...), never from another stage.
- `needs_hessian`, `stack_rows` as for methods; `own_mask` (obr): the stage prunes with its own mask knobs.

The per-linear stages run inside the pipeline's one sequential pass per block (toolkit.compress.blocks): each linear
goes through them in order on the same Hessian, so [sparsegpt, gptq] prunes then quantizes each linear exactly as the
two-stage method did. Rules (bad input otherwise): transforms first (smooth before rotate), at most one pruner and
one quantizer, no pruner after the quantizer nor before a stage with its own mask, at least one pruner or
quantizer, no stage twice. The resolved recipe (every stage with every knob, "auto" values resolved) becomes the
run's `stages` config entry, so --dry-run and run.json show it. Torch-free at import (the CLI validates recipes)."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from toolkit.core.errors import BadInputError
from toolkit.core.registry import Entry, registry
from toolkit.core.registry import stages as named_stages

KIND = "compress-stage"
QUANT_KNOBS = ["w_bits", "group_size", "w_clip", "w_clip_search", "w_range"]  # every quantizer's grid
MASK_KNOBS = ["sparsity", "nm"]


class TransformStage(Protocol):
    """A whole-model stage (role "transform"): changes the model in place before the block pass; returns what the
    export needs ({"rotation": record} for rotate) or an empty dict. Per-linear stages are CompressMethod."""

    def __call__(self, view: Any, windows: Any, stage_config: Any, run_config: Any, ctx: Any) -> dict: ...


@dataclass(frozen=True)
class Stage:
    entry: Entry
    config: Any  # the stage's config: its knobs over the run's shared fields

    @property
    def name(self) -> str:
        return self.entry.name

    @property
    def role(self) -> str:
        return self.entry.meta["role"]

    @property
    def knobs(self) -> dict[str, Any]:
        return {knob: getattr(self.config, knob) for knob in self.entry.meta.get("knobs", ())}

    def transform(self, view, windows, run_config, ctx) -> dict:
        return self.entry.obj(view, windows, self.config, run_config, ctx) or {}


def stage(name: str, config: Any) -> Stage:
    """A registered stage with a ready config (a method that runs a fixed recipe passes its own config)."""
    return Stage(registry(KIND).get(name), config)


def load_recipe(path: str | Path) -> list:
    """The stage list of a recipe file: a YAML list, or a mapping whose only key is `stages`."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise BadInputError(f"recipe file not found: {path}")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError):
        raise BadInputError(f"recipe {path} is not valid YAML text") from None
    if isinstance(data, dict) and set(data) == {"stages"}:
        data = data["stages"]
    if not isinstance(data, list) or not data:
        raise BadInputError(f"recipe {path} must be a list of stages (or `stages:` holding one)",
                            "e.g. stages: [sparsegpt, {gptq: {w_bits: 4}}]")
    return data


def check_order(entries: list[Entry]) -> None:
    """The composition rules (module docstring), as one bad-input line each."""
    names, roles = [e.name for e in entries], [e.meta["role"] for e in entries]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise BadInputError(f"recipe stage '{twice[0]}' appears twice")
    linear = [i for i, role in enumerate(roles) if role != "transform"]
    if not linear:
        raise BadInputError("the recipe has no pruning or quantization stage", "add one, e.g. - gptq: {w_bits: 4}")
    late = [names[i] for i, role in enumerate(roles) if role == "transform" and i > linear[0]]
    if late:
        raise BadInputError(f"recipe stage '{late[0]}' is a whole-model transform: it goes before the per-linear "
                            f"stages ('{names[linear[0]]}')")
    if "rotate" in names and "smooth" in names and names.index("rotate") < names.index("smooth"):
        raise BadInputError("recipe: smooth after rotate (the rotation already spreads the outlier channels that "
                            "smoothing migrates)", "put smooth before rotate")
    quant = [n for n, role in zip(names, roles) if role == "quantize"]
    prune = [n for n, role in zip(names, roles) if role == "prune"]
    if len(quant) > 1:
        raise BadInputError(f"recipe has two quantizers ({', '.join(quant)}): a recipe quantizes once")
    if len(prune) > 1:
        raise BadInputError(f"recipe has two pruners ({', '.join(prune)}): a recipe prunes once")
    if quant and prune and names.index(quant[0]) < names.index(prune[0]):
        raise BadInputError(f"recipe quantizer '{quant[0]}' comes before pruner '{prune[0]}' (pruning after "
                            "quantization leaves the kept weights' errors uncompensated)",
                            f"prune first: [{prune[0]}, {quant[0]}]")
    own = [n for n in quant if entries[names.index(n)].meta.get("own_mask")]
    if own and prune:
        raise BadInputError(f"recipe stage '{own[0]}' prunes with its own mask (its sparsity/nm/mask knobs): drop "
                            f"the '{prune[0]}' stage", f"e.g. - {own[0]}: {{mask: wanda, sparsity: 0.5}}")


def owned_fields() -> set[str]:
    """Run-config fields that belong to stages in a recipe (set on a stage, never at the top of the config)."""
    return {k for entry in registry(KIND) for k in entry.meta.get("knobs", ())} | {"rotate"}


def resolve(spec: Any, run: dict[str, Any]) -> list[Stage]:
    """The stages of a recipe spec (names or one-key mappings {name: {knob: value}}), each with its validated config:
    its knobs over `run`'s shared fields, with the rotation-dependent "auto" values resolved."""
    from pydantic import ValidationError

    from toolkit.compress.config import resolve_defaults

    pairs = named_stages(KIND, spec)
    check_order([entry for entry, _ in pairs])
    rotate, owned, resolved = any(entry.name == "rotate" for entry, _ in pairs), owned_fields(), []
    for entry, options in pairs:
        fields = entry.config.model_fields
        shared = {k: v for k, v in run.items() if k in fields and k not in owned and k != "method"}
        try:
            config = entry.config(**shared, **options)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise BadInputError(f"recipe stage '{entry.name}': {where}: {' '.join(str(first['msg']).split())}") \
                from None
        resolved.append(Stage(entry, config if entry.meta["role"] == "transform" else
                              resolve_defaults(config, rotate)))
    return resolved


def record(stages: list[Stage]) -> list[dict[str, dict[str, Any]]]:
    """The resolved recipe as run.json holds it: [{name: {every knob: value}}]."""
    return [{s.name: s.knobs} for s in stages]


def derived_fields(stages: list[Stage], run_cls: type) -> dict[str, Any]:
    """The run-level values the stages decide (w_bits, sparsity, rotate, ... as the export and the report read
    them): the quantizer's knob first, then the pruner's, then a transform's; else the run config's default."""
    ordered = sorted(stages, key=lambda s: ("quantize", "prune", "transform").index(s.role))
    values = {}
    for name in owned_fields() & set(run_cls.model_fields):
        holder = next((s for s in ordered if name in s.entry.meta.get("knobs", ())), None)
        values[name] = getattr(holder.config, name) if holder else run_cls.model_fields[name].default
    values["rotate"] = any(s.name == "rotate" for s in stages)
    return values


def apply_recipe(config):
    """RecipeConfig's validation: its stages (from `recipe`, the YAML file, else inline `stages`) resolved, checked,
    recorded in `stages`, and the run-level values they decide set. A stage knob set at the top of the config with
    another value than its stage's is bad input (it would be ignored)."""
    spec = load_recipe(config.recipe) if config.recipe else config.stages
    if not spec:
        raise BadInputError("a recipe needs its stages: --recipe FILE.yaml (or `stages:` in --config)",
                            "e.g. stages: [sparsegpt, {gptq: {w_bits: 4}}] (examples/compress-recipes/)")
    stages = resolve(spec, config.model_dump())
    if config.onload and any(s.role == "transform" for s in stages):
        raise BadInputError("recipe: whole-model stages (smooth, rotate) need the model in memory; onload=true "
                            "runs per-linear stages only", "drop onload, or the transform stages")
    derived = derived_fields(stages, type(config))
    for name in sorted(config.model_fields_set & set(derived)):
        if getattr(config, name) != derived[name]:
            raise BadInputError(f"'{name}' is a stage knob in a recipe: set it on its stage, not at the top",
                                f"e.g. - gptq: {{{name}: ...}}")
    for name, value in {**derived, "stages": record(stages)}.items():
        setattr(config, name, value)
    return config


def of(config) -> list[Stage]:
    """A recipe config's resolved stages (from its recorded `stages`; resolved once per distinct config)."""
    return list(_resolved(json.dumps(config.model_dump(mode="json"), sort_keys=True), type(config)))


@functools.lru_cache(maxsize=8)
def _resolved(dumped: str, run_cls: type) -> tuple[Stage, ...]:
    run = json.loads(dumped)
    return tuple(resolve(run["stages"], run))


def transforms(config, rotate: bool) -> list[Stage]:
    """The whole-model steps before the block pass: a recipe's transform stages; for a method, the rotation when
    the run rotates (its config carries the rotation knobs)."""
    if getattr(config, "stages", None):
        return [s for s in of(config) if s.role == "transform"]
    return [stage("rotate", config)] if rotate else []


def linear_stages(config) -> list[Stage]:
    return [s for s in of(config) if s.role != "transform"]


def needs_hessian(config) -> bool:
    return any(s.entry.meta.get("needs_hessian") for s in linear_stages(config))


def stacks_rows(config) -> bool:
    """Row-stacked solves of a sequential group (one GPTQ column loop for q/k/v) when every stage allows them."""
    return all(s.entry.meta.get("stack_rows") for s in linear_stages(config))


def run_linear(job, stages: list[Stage]):
    """One linear through the per-linear stages, in order, on the job's Hessian: each stage gets the weights and the
    kept mask the previous one left. A recipe without a quantizer ends with W·keep. Returns (Ŵ, keep, grid)."""
    from toolkit.compress.job import LinearJob

    W, keep, grid = job.W, None, None
    for each in stages:
        W, keep, grid = each.entry.obj(LinearJob(W, job.hessian_raw, job.hessian, each.config, keep=keep))
    if grid is None and keep is not None:
        W = W * keep
    return W, keep, grid
