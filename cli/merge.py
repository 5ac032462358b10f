"""`iclrkit merge latent train|run | average | task-arithmetic | ties | mergekit | padded | zoo | lm-zoo`: model merging."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from cli._options import ConfigOpt, DeviceOpt, DryRunOpt, JsonOpt, OutOpt, OverwriteOpt, ResumeOpt, SeedOpt, SetOpt
from cli._runner import Common, execute

app = typer.Typer(no_args_is_help=True, help="Merge models: LS-Merge (latent space) and weight-space baselines.")
latent_app = typer.Typer(no_args_is_help=True, help="LS-Merge: train a weight VAE, merge in its latent space.")
app.add_typer(latent_app, name="latent")

ModelsOpt = Annotated[Optional[list[str]], typer.Option(
    "--model", "--models", "-m", help="Models: --model repeated and/or comma separated (--models is the same); "
                                      "a folder of model dirs expands.")]
WeightsOpt = Annotated[Optional[str], typer.Option("--weights", help="Merge weight per model, comma separated.")]
TargetOpt = Annotated[Optional[str], typer.Option("--target", help="Model whose layout (sizes) the result takes.")]
BaseOpt = Annotated[Optional[str], typer.Option("--base", help="The common pre-trained model (task vectors).")]
ScalingOpt = Annotated[Optional[float], typer.Option("--scaling", help="λ scaling of the task vectors.")]


def _weights(text: str | None) -> list[float] | None:
    from toolkit.core.errors import BadInputError

    if text is None:
        return None
    try:
        return [float(w) for w in text.split(",")]
    except ValueError:
        raise BadInputError(f"--weights expects numbers separated by commas, got {text!r}") from None


def _inputs(models, *more) -> dict:
    items = [m for item in (models or []) for m in item.split(",") if m.strip()]
    named = {f"model{i}": m for i, m in enumerate(items)}
    named.update({f"extra{i}": m for i, m in enumerate(more) if m})
    return named


def _run(technique, config_cls, run, flags, common, models, *more):
    if _is_mergekit(common.config):
        _mergekit(common.config, common, technique)
        return
    execute(technique=technique, config_cls=config_cls, flags=flags, common=common, run=run,
            inputs=_inputs(models, *more))


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


def _mergekit(path, common: Common, technique: str | None = None) -> None:
    """Translate a mergekit YAML (bad ones: one line, exit 2, before anything is written) and run it."""
    import shlex
    import sys
    from dataclasses import replace

    from cli._runner import fail
    from toolkit.core.errors import BadInputError, IclrkitError
    from toolkit.merge import mergekit as mk

    try:
        data, text = mk.read(path)
        translation = mk.translate(data, text, source=str(path))
        method = translation.config.merge_method
        if technique is not None and mk.TECHNIQUE[method] != technique:
            raise BadInputError(f"{path} is a mergekit {method} config, but this is `iclrkit {technique.replace('.', ' ')}`",
                                f"run `iclrkit merge mergekit {path}`")
        if common.set:
            raise BadInputError("--set does not apply to a mergekit config", "edit the YAML")
    except IclrkitError as exc:
        fail(exc)
    command = "iclrkit " + shlex.join(sys.argv[1:])
    config = translation.config
    execute(technique=f"merge.mergekit.{method}", config_cls=mk.MergekitConfig, flags=config.model_dump(),
            common=replace(common, config=None, extra_inputs={**common.extra_inputs, "mergekit_config": str(path)}),
            run=lambda cfg, ctx: mk.run_mergekit(cfg, ctx, translation, command),
            plan=lambda cfg, ctx: {"equivalent_command": translation.equivalent, "notes": translation.notes},
            inputs=_inputs(config.models, config.base))


def _or_fail(parse, text):
    """Parse a flag before execute() so a bad value still ends as one line + exit code 2."""
    from cli._runner import fail
    from toolkit.core.errors import IclrkitError

    try:
        return parse(text)
    except IclrkitError as exc:
        fail(exc)


@latent_app.command("train", help="Train the two-stage weight VAE on a zoo of checkpoints.",
                    epilog="Examples: iclrkit merge latent train -m runs/zoo/models --target runs/zoo/models/w64-s0-5to9 "
                           "-o runs/vae | iclrkit merge latent train -m a,b,c --set stage1_steps=500 -o vae --resume")
def latent_train(models: ModelsOpt = None, target: TargetOpt = None,
                 holdout: Annotated[Optional[str], typer.Option(help="Checkpoints scored only, comma separated.")] = None,
                 stage1_steps: Annotated[Optional[int], typer.Option(help="Stage-1 steps.")] = None,
                 stage2_steps: Annotated[Optional[int], typer.Option(help="Stage-2 (compact code) steps.")] = None,
                 out: OutOpt = None, config: ConfigOpt = None, set_: SetOpt = None, seed: SeedOpt = None,
                 device: DeviceOpt = None, dry_run: DryRunOpt = False, json_: JsonOpt = False,
                 overwrite: OverwriteOpt = False, resume: ResumeOpt = False) -> None:
    from toolkit.merge.latent import LatentTrainConfig, run_train

    _run("merge.latent.train", LatentTrainConfig, run_train,
         {"models": models, "target": target, "holdout": holdout.split(",") if holdout else None,
          "stage1_steps": stage1_steps, "stage2_steps": stage2_steps}, Common.of(locals()), models, target)


@latent_app.command("run", help="Merge models by interpolating their VAE codes and decoding.",
                    epilog="Examples: iclrkit merge latent run --vae runs/vae -m a,b -o merged | "
                           "iclrkit merge latent run --vae runs/vae -m small,big --target big --weights 0.3,0.7 "
                           "--interpolation slerp -o merged | iclrkit merge latent run --vae runs/vae -m a,b "
                           "--no-residual -o pure")
def latent_run(models: ModelsOpt = None,
               vae: Annotated[Optional[str], typer.Option(help="VAE directory from `merge latent train`.")] = None,
               weights: WeightsOpt = None, target: TargetOpt = None,
               interpolation: Annotated[Optional[str], typer.Option(help="linear | slerp.")] = None,
               code: Annotated[Optional[str], typer.Option(help="compact (stage 2) | full (stage 1).")] = None,
               residual: Annotated[Optional[bool], typer.Option(
                   "--residual/--no-residual", help="Add back each parent's exact VAE reconstruction residual "
                                                    "(default on; --no-residual: the pure decoded merge).")] = None,
               out: OutOpt = None, config: ConfigOpt = None, set_: SetOpt = None, seed: SeedOpt = None,
               device: DeviceOpt = None, dry_run: DryRunOpt = False, json_: JsonOpt = False,
               overwrite: OverwriteOpt = False) -> None:
    from toolkit.merge.latent import LatentMergeConfig, run_merge

    _run("merge.latent", LatentMergeConfig, run_merge,
         {"models": models, "vae": vae, "weights": _or_fail(_weights, weights), "target": target,
          "interpolation": interpolation, "code": code, "residual": residual}, Common.of(locals()), models, vae,
         target)


@app.command("average", help="Weight averaging of same-size models.",
             epilog="Examples: iclrkit merge average -m a,b -o merged | iclrkit merge average -m a -m b --weights 0.7,0.3 -o m")
def average(models: ModelsOpt = None, weights: WeightsOpt = None, out: OutOpt = None, config: ConfigOpt = None,
            set_: SetOpt = None, seed: SeedOpt = None, device: DeviceOpt = None, dry_run: DryRunOpt = False,
            json_: JsonOpt = False, overwrite: OverwriteOpt = False) -> None:
    from toolkit.merge.weightspace import AverageConfig, run_average

    _run("merge.average", AverageConfig, run_average, {"models": models, "weights": _or_fail(_weights, weights)},
         Common.of(locals()), models)


@app.command("task-arithmetic", help="Task arithmetic: base + λ · sum of task vectors.",
             epilog="Examples: iclrkit merge task-arithmetic -m a,b --base backbone --scaling 0.5 -o merged")
def task_arithmetic(models: ModelsOpt = None, base: BaseOpt = None, scaling: ScalingOpt = None, out: OutOpt = None,
                    config: ConfigOpt = None, set_: SetOpt = None, seed: SeedOpt = None, device: DeviceOpt = None,
                    dry_run: DryRunOpt = False, json_: JsonOpt = False, overwrite: OverwriteOpt = False) -> None:
    from toolkit.merge.weightspace import TaskArithmeticConfig, run_task_arithmetic

    _run("merge.task-arithmetic", TaskArithmeticConfig, run_task_arithmetic,
         {"models": models, "base": base, "scaling": scaling}, Common.of(locals()), models, base)


@app.command("ties", help="TIES-Merging: trim, elect sign, disjoint mean of task vectors.",
             epilog="Examples: iclrkit merge ties -m a,b --base backbone --density 0.2 -o merged")
def ties(models: ModelsOpt = None, base: BaseOpt = None, scaling: ScalingOpt = None,
         density: Annotated[Optional[float], typer.Option(help="Fraction of each task vector kept.")] = None,
         out: OutOpt = None, config: ConfigOpt = None, set_: SetOpt = None, seed: SeedOpt = None,
         device: DeviceOpt = None, dry_run: DryRunOpt = False, json_: JsonOpt = False,
         overwrite: OverwriteOpt = False) -> None:
    from toolkit.merge.weightspace import TiesConfig, run_ties

    _run("merge.ties", TiesConfig, run_ties, {"models": models, "base": base, "scaling": scaling, "density": density},
         Common.of(locals()), models, base)


@app.command("mergekit", help="Run a mergekit YAML (linear | task_arithmetic | ties; per-model weight and density, "
                              "base_model, dtype, normalize, lambda) as the equivalent iclrkit merge; the model dir "
                              "gets mergekit_config.yml and a card with the command.",
             epilog="Examples: iclrkit merge mergekit ties.yml -o merged | iclrkit merge mergekit linear.yml --dry-run "
                    "| iclrkit merge ties --config ties.yml -o merged (a mergekit --config works on the matching "
                    "command too)")
def mergekit(config_file: Annotated[Path, typer.Argument(metavar="CONFIG.yml", help="mergekit YAML.")],
             out: OutOpt = None, seed: SeedOpt = None, device: DeviceOpt = None, dry_run: DryRunOpt = False,
             json_: JsonOpt = False, overwrite: OverwriteOpt = False) -> None:
    _mergekit(config_file, Common.of(locals()))


@app.command("padded", help="Different widths/depths: shallower models deepened with identity layers, then "
                            "zero-pad/truncate to the target's shapes and average (--align matches units first).",
             epilog="Examples: iclrkit merge padded -m small,big --target big -o merged | "
                    "iclrkit merge padded -m small,big --target big --align -o merged")
def padded(models: ModelsOpt = None, target: TargetOpt = None, weights: WeightsOpt = None,
           align: Annotated[Optional[bool], typer.Option("--align/--no-align", help="Weight-match units first.")] = None,
           out: OutOpt = None, config: ConfigOpt = None, set_: SetOpt = None, seed: SeedOpt = None,
           device: DeviceOpt = None, dry_run: DryRunOpt = False, json_: JsonOpt = False,
           overwrite: OverwriteOpt = False) -> None:
    from toolkit.merge.weightspace import PaddedConfig, run_padded

    _run("merge.padded", PaddedConfig, run_padded,
         {"models": models, "target": target, "weights": _or_fail(_weights, weights), "align": align},
         Common.of(locals()), models, target)


@app.command("zoo", help="Build the merge zoo: digits MLPs of two widths, fine-tuned on sub-tasks (seconds).",
             epilog="Examples: iclrkit merge zoo -o runs/zoo | iclrkit merge zoo --set widths=[64,32] "
                    "--set seeds=[0,1] -o zoo")
def zoo(out: OutOpt = None, config: ConfigOpt = None, set_: SetOpt = None, seed: SeedOpt = None,
        dry_run: DryRunOpt = False, json_: JsonOpt = False, overwrite: OverwriteOpt = False) -> None:
    from toolkit.merge.digits import DigitsZooConfig, run_zoo

    execute(technique="merge.zoo", config_cls=DigitsZooConfig, flags={}, common=Common.of(locals(), device="cpu"),
            run=run_zoo)


@app.command("lm-zoo", help="Build the LM merge zoo: tiny GPT-2s of two widths fine-tuned on two texts (minutes).",
             epilog="Examples: iclrkit merge lm-zoo --config examples/merge-latent/gpt2-zoo.yaml -o runs/lm-zoo | "
                    "iclrkit merge lm-zoo --config my-texts.yaml --set widths=[32,64] --set backbone_steps=50 -o lmzoo")
def lm_zoo(out: OutOpt = None, config: ConfigOpt = None, set_: SetOpt = None, seed: SeedOpt = None,
           dry_run: DryRunOpt = False, json_: JsonOpt = False, overwrite: OverwriteOpt = False) -> None:
    from toolkit.merge.lmzoo import LMZooConfig, run_lm_zoo

    execute(technique="merge.lm-zoo", config_cls=LMZooConfig, flags={}, common=Common.of(locals(), device="cpu"),
            run=run_lm_zoo)
