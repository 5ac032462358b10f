"""`iclrkit explain ...`: explanations of model decisions (one function per command)."""

from __future__ import annotations

from typing import Annotated

import typer

from cli._options import (
    ConfigOpt,
    DeviceOpt,
    DryRunOpt,
    JsonOpt,
    ModelOpt,
    OutOpt,
    OverwriteOpt,
    SeedOpt,
    SetOpt,
)
from cli._runner import Common, execute

app = typer.Typer(no_args_is_help=True, help="Explain model decisions.")

ImagesOpt = Annotated[str | None, typer.Option("--data", "-d", help="Images: digits[:test|:train], .npy, or "
                                                                        ".npz with x (and y), values in [0, 1].")]
EpsilonOpt = Annotated[float | None, typer.Option(help="L-inf radius of the perturbation box (default 0.05).")]
SamplesOpt = Annotated[int | None, typer.Option("--n-samples", "-n", help="Images to explain (default 100).")]
VerifyOpt = Annotated[str | None, typer.Option(help="none | exact: prove each explanation with a MILP (SCIP).")]
AttackOpt = Annotated[str | None, typer.Option(help="pgd | fgsm | none: attack proving pixels necessary.")]


def _formal_plan(config, ctx) -> dict:
    return {"model": config.model, "data": config.data, "epsilon": config.epsilon, "images": config.n_samples,
            "outputs": ["explanations.json", "overlays.png", "run.json"]}


@app.command("fame", help="Formal abstract minimal explanations (FAME, arXiv 2603.10661) with CROWN bounds.",
             epilog="Examples: iclrkit explain fame -m zoo:digits-mlp --out runs/fame | "
                    "iclrkit explain fame -m net.onnx -d images.npz --epsilon 0.02 --verify exact --out runs/f")
def fame(
    model: ModelOpt,
    data: ImagesOpt = None,
    epsilon: EpsilonOpt = None,
    n_samples: SamplesOpt = None,
    knapsack: Annotated[str | None, typer.Option(help="greedy | exact (0/1 knapsack by SCIP).")] = None,
    refine: Annotated[str | None, typer.Option(help="none | exact: MILP pass over the undecided pixels.")] = None,
    verify: VerifyOpt = None,
    attack: AttackOpt = None,
    out: OutOpt = None, config: ConfigOpt = None, set_: SetOpt = None, seed: SeedOpt = None,
    device: DeviceOpt = None, dry_run: DryRunOpt = False, json_: JsonOpt = False, overwrite: OverwriteOpt = False,
) -> None:
    from toolkit.explain.fame import FameConfig, run

    execute(technique="explain.fame", config_cls=FameConfig,
            flags={"model": model, "data": data, "epsilon": epsilon, "n_samples": n_samples, "knapsack": knapsack,
                   "refine": refine, "verify": verify, "attack": attack},
            common=Common.of(locals()),
            run=run, inputs={"model": model if not model.startswith("zoo:") else None, "data": data},
            plan=_formal_plan)


@app.command("verix", help="VeriX/VERIX+-style sequential explanations (baseline) with a CROWN or exact oracle.",
             epilog="Examples: iclrkit explain verix -m zoo:digits-mlp --out runs/verix | "
                    "iclrkit explain verix -m zoo:digits-mlp --oracle exact -n 10 --out runs/verix-exact")
def verix(
    model: ModelOpt,
    data: ImagesOpt = None,
    epsilon: EpsilonOpt = None,
    n_samples: SamplesOpt = None,
    order: Annotated[str | None, typer.Option(help="bounds (VERIX+) | sensitivity (VeriX).")] = None,
    oracle: Annotated[str | None, typer.Option(help="crown | ibp | exact (MILP).")] = None,
    verify: VerifyOpt = None,
    attack: AttackOpt = None,
    out: OutOpt = None, config: ConfigOpt = None, set_: SetOpt = None, seed: SeedOpt = None,
    device: DeviceOpt = None, dry_run: DryRunOpt = False, json_: JsonOpt = False, overwrite: OverwriteOpt = False,
) -> None:
    from toolkit.explain.verix import VerixConfig, run

    execute(technique="explain.verix", config_cls=VerixConfig,
            flags={"model": model, "data": data, "epsilon": epsilon, "n_samples": n_samples, "order": order,
                   "oracle": oracle, "verify": verify, "attack": attack},
            common=Common.of(locals()),
            run=run, inputs={"model": model if not model.startswith("zoo:") else None, "data": data},
            plan=_formal_plan)
