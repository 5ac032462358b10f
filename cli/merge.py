"""`iclrkit merge latent train|run | average | task-arithmetic | ties | ... | mergekit | padded | zoo | lm-zoo`: model
merging.

One command per merge method on the registry (toolkit/merge/methods/, one file each), its options generated from the config's
fields (toolkit/merge/config.py): each knob is declared once, there."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any, Callable

import typer

from cli._fields import STANDARD, config_command
from cli._options import DeviceOpt, DryRunOpt, JsonOpt, OutOpt, OverwriteOpt, SeedOpt
from cli._runner import Common
from toolkit.core.registry import registry
from toolkit.merge.config import DigitsZooConfig, LatentTrainConfig, LMZooConfig

app = typer.Typer(no_args_is_help=True, help="Merge models: LS-Merge (latent space) and weight-space baselines.")
latent_app = typer.Typer(no_args_is_help=True, help="LS-Merge: train a weight VAE, merge in its latent space.")
app.add_typer(latent_app, name="latent")
GROUPS = {"latent": latent_app}
BUILD = ("out", "config", "set_", "seed", "dry_run", "json_", "overwrite")  # the zoo builders run on the CPU


def _inputs(models, *more) -> dict:
    items = [m for item in (models or []) for m in item.split(",") if m.strip()]
    named = {f"model{i}": m for i, m in enumerate(items)}
    named.update({f"extra{i}": m for i, m in enumerate(more) if m})
    return named


def _inputs_of(fields: tuple[str, ...]) -> Callable[[dict], dict]:
    return lambda typed: _inputs(typed.get("models"), *(typed.get(name) for name in fields))


def _aliases(command: Callable, config: type) -> None:
    """Extra flag names a field declares (`aliases`, e.g. --models for --model) on the generated option."""
    import typing

    for name, field in config.model_fields.items():
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        if extra.get("aliases") and name in command.__signature__.parameters:
            info = typing.get_args(command.__signature__.parameters[name].annotation)[1]
            info.param_decls = (*info.param_decls, *extra["aliases"])


def _or_mergekit(technique: str) -> Callable[..., None]:
    """Run the command, or, when its --config is a mergekit YAML, that config's translation (same method only)."""

    def run(**job: Any) -> None:
        from cli._runner import execute

        common = job["common"]
        if _is_mergekit(common.config):
            _mergekit(common.config, common, technique)
            return
        execute(**job)

    return run


def _on_cpu(**job: Any) -> None:
    from cli._runner import execute

    execute(**{**job, "common": replace(job["common"], device="cpu")})


def _is_mergekit(path) -> bool:
    """A --config with mergekit's `merge_method` key is run through the mergekit translation."""
    if path is None:
        return False
    from toolkit.core.config import load_yaml
    from toolkit.core.errors import IclrkitError

    try:
        return "merge_method" in load_yaml(path)
    except IclrkitError:
        return False  # resolve_config reports it


def _mergekit(path, common: Common, technique: str | None = None, numerics: str = "float64") -> None:
    """Translate a mergekit YAML (bad ones: one line, exit 2, before anything is written) and run it."""
    import shlex
    import sys

    from cli._runner import execute, fail
    from toolkit.core.errors import BadInputError, IclrkitError
    from toolkit.merge import mergekit as mk

    try:
        data, text = mk.read(path)
        translation = mk.translate(data, text, source=str(path), numerics=numerics)
        method = translation.merge_method
        if technique is not None and f"merge.{translation.entry.name}" != technique:
            raise BadInputError(f"{path} is a mergekit {method} config, but this is `iclrkit {technique.replace('.', ' ')}`",
                                f"run `iclrkit merge mergekit {path}`")
        if common.set:
            raise BadInputError("--set does not apply to a mergekit config", "edit the YAML")
    except IclrkitError as exc:
        fail(exc)
    command = "iclrkit " + shlex.join(sys.argv[1:])
    config = translation.config
    execute(technique=f"merge.mergekit.{method}", config_cls=type(config), flags=config.model_dump(),
            common=replace(common, config=None, extra_inputs={**common.extra_inputs, "mergekit_config": str(path)}),
            run=lambda cfg, ctx: mk.run_mergekit(cfg, ctx, translation, command),
            plan=lambda cfg, ctx: {"equivalent_command": translation.equivalent, "notes": translation.notes},
            inputs=_inputs(config.models, getattr(config, "base", None)))


_latent_train = config_command(
    latent_app, "train", config=LatentTrainConfig, run="toolkit.merge.latent:run_train", technique="merge.latent.train",
    help="Train the two-stage weight VAE on a zoo of checkpoints.",
    epilog="Examples: iclrkit merge latent train -m runs/zoo/models --target runs/zoo/models/w64-s0-5to9 "
           "-o runs/vae | iclrkit merge latent train -m a,b,c --set stage1_steps=500 -o vae --resume",
    flags=["models", "target", "holdout", "stage1_steps", "stage2_steps"], common=(*STANDARD, "resume"),
    inputs=_inputs_of(("target",)),
    execute_with=_or_mergekit("merge.latent.train"))
_aliases(_latent_train, LatentTrainConfig)

# one command per registered merge method (toolkit/merge/methods/): a new method appears here by itself
for _method in registry("merge"):
    _technique = f"merge.{_method.name}"
    _command = config_command(
        GROUPS.get(_method.meta.get("group"), app), _method.meta.get("command", _method.name), config=_method.config,
        run="toolkit.merge.weightspace:run_weightspace" if _method.tensorwise else _method.obj,
        technique=_technique, help=_method.help, epilog=_method.meta.get("epilog"), flags=_method.flags,
        inputs=_inputs_of(_method.meta.get("inputs", ())), execute_with=_or_mergekit(_technique),
        fixed={"method": _method.name} if "method" in _method.config.model_fields else None)
    _aliases(_command, _method.config)


@app.command("mergekit", help="Run a mergekit YAML as the registered iclrkit merge computing it (linear, "
                              "task_arithmetic, ties, dare_ties, dare_linear, della, della_linear, breadcrumbs, "
                              "breadcrumbs_ties, model_stock, slerp, passthrough with slices; per-model and gradient "
                              "parameters, base_model, dtype); the model dir gets mergekit_config.yml and a card with "
                              "the command.",
             epilog="Examples: iclrkit merge mergekit ties.yml -o merged | iclrkit merge mergekit linear.yml --dry-run "
                    "| iclrkit merge ties --config ties.yml -o merged (a mergekit --config works on the matching "
                    "command too)")
def mergekit(config_file: Annotated[Path, typer.Argument(metavar="CONFIG.yml", help="mergekit YAML.")],
             out: OutOpt = None, seed: SeedOpt = None, device: DeviceOpt = None, dry_run: DryRunOpt = False,
             json_: JsonOpt = False, overwrite: OverwriteOpt = False,
             numerics: Annotated[str, typer.Option(help="float64 (default: computed in float64, rounded once) | "
                                                        "mergekit (computed in the YAML's dtype as mergekit 0.1.5 "
                                                        "does: byte-identical to it).")] = "float64") -> None:
    if numerics not in ("float64", "mergekit"):
        from cli._runner import fail
        from toolkit.core.errors import BadInputError

        fail(BadInputError(f"--numerics must be float64 or mergekit, got {numerics!r}"))
    common = Common.of({k: v for k, v in locals().items() if k != "numerics"})
    _mergekit(config_file, common, numerics=numerics)


config_command(app, "zoo", config=DigitsZooConfig, run="toolkit.merge.digits:run_zoo", technique="merge.zoo",
               help="Build the merge zoo: digits MLPs of two widths, fine-tuned on sub-tasks (seconds).",
               epilog="Examples: iclrkit merge zoo -o runs/zoo | iclrkit merge zoo --set widths=[64,32] "
                      "--set seeds=[0,1] -o zoo", common=BUILD, execute_with=_on_cpu)

config_command(app, "lm-zoo", config=LMZooConfig, run="toolkit.merge.lmzoo:run_lm_zoo", technique="merge.lm-zoo",
               help="Build the LM merge zoo: tiny GPT-2s of two widths fine-tuned on two texts (minutes).",
               epilog="Examples: iclrkit merge lm-zoo --config examples/merge-latent/gpt2-zoo.yaml -o runs/lm-zoo | "
                      "iclrkit merge lm-zoo --config my-texts.yaml --set widths=[32,64] --set backbone_steps=50 "
                      "-o lmzoo", common=BUILD, execute_with=_on_cpu)
