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
            run=run, inputs={"model": model, "data": data},
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
            run=run, inputs={"model": model, "data": data},
            plan=_formal_plan)


@app.command("cave", help="CAVE (arXiv 2503.13429): neural object volumes + sparse 3D concepts; trains, scores "
                          "accuracy on OOD splits and 3D-C against 2D CNN baselines (NMF concepts, Grad-CAM).",
             epilog="Examples: iclrkit explain cave --out runs/cave | iclrkit explain cave -d runs/cave/dataset.npz "
                    "--epochs 10 --set concepts_per_class=20 --out runs/cave2")
def cave(
    data: Annotated[str | None, typer.Option("--data", "-d", help="'synthetic' (rendered here), 'pascal3d:ROOT' "
                                                                  "(PASCAL3D+ release1.1 layout; classes via --set "
                                                                  "classes=[car]) or a dataset .npz written by a "
                                                                  "previous run.")] = None,
    epochs: Annotated[int | None, typer.Option(help="NOVUM training epochs (default 40).")] = None,
    concepts: Annotated[int | None, typer.Option("--concepts", help="K-means concepts per class (default 8).")] = None,
    classifier: Annotated[str | None, typer.Option(help="repo (FeatureMatchingCAVE) | paper.")] = None,
    baselines: Annotated[bool | None, typer.Option("--baselines/--no-baselines",
                                                   help="Also train and score the 2D CNN baselines.")] = None,
    out: OutOpt = None, config: ConfigOpt = None, set_: SetOpt = None, seed: SeedOpt = None,
    device: DeviceOpt = None, dry_run: DryRunOpt = False, json_: JsonOpt = False, overwrite: OverwriteOpt = False,
) -> None:
    from toolkit.explain.cave import CaveConfig
    from toolkit.explain.cave_run import run

    execute(technique="explain.cave", config_cls=CaveConfig,
            flags={"data": data, "epochs": epochs, "concepts_per_class": concepts, "classifier": classifier,
                   "baselines": baselines},
            common=Common.of(locals()), run=run,
            inputs={"data": data.removeprefix("pascal3d:") if data and data != "synthetic" else None},
            plan=lambda cfg, ctx: {"data": cfg.data, "epochs": cfg.epochs, "baselines": cfg.baselines,
                                   "outputs": ["results.json", "attributions_*.npz", "cave.safetensors",
                                               "concept_maps.png", "concepts_on_mesh_*.png", "run.json"]})


@app.command("consistency", help="3D consistency (3D-C) of any concept method's attribution maps, projected onto "
                                 "the ground-truth meshes through the dataset's pix_to_face maps.",
             epilog="Examples: iclrkit explain consistency -d runs/cave/dataset.npz "
                    "--attributions runs/cave/attributions_cave.npz --json")
def consistency(
    data: Annotated[str, typer.Option("--data", "-d", help="Dataset .npz with pix_to_face and meshes.")],
    attributions: Annotated[str, typer.Option("--attributions", "-a", help=".npz with maps (N, D, H, W) and "
                                                                           "index (N,) into the dataset.")],
    method: Annotated[str | None, typer.Option(help="Method name for the report.")] = None,
    out: OutOpt = None, config: ConfigOpt = None, set_: SetOpt = None, seed: SeedOpt = None,
    device: DeviceOpt = None, dry_run: DryRunOpt = False, json_: JsonOpt = False, overwrite: OverwriteOpt = False,
) -> None:
    from toolkit.explain.consistency import ConsistencyConfig, run

    execute(technique="explain.consistency", config_cls=ConsistencyConfig,
            flags={"data": data, "attributions": attributions, "method": method},
            common=Common.of(locals()), run=run, inputs={"data": data, "attributions": attributions},
            needs_out=False)
