"""`iclrkit explain fame | verix | cave | consistency`: explanations of model decisions.

Options come from the configs' fields (toolkit/explain/config.py): each knob is declared once, there."""

from __future__ import annotations

import typer

from cli._fields import config_command
from toolkit.core.registry import registry
from toolkit.explain.config import FORMAL_FLAGS, FORMAL_TAIL, CaveConfig, ConsistencyConfig

app = typer.Typer(no_args_is_help=True, help="Explain model decisions.")


def _formal_plan(config, ctx) -> dict:
    return {"model": config.model, "data": config.data, "epsilon": config.epsilon, "images": config.n_samples,
            "outputs": ["explanations.json", "overlays.png", "run.json"]}


def _cave_plan(config, ctx) -> dict:
    return {"data": config.data, "epochs": config.epochs, "baselines": config.baselines,
            "outputs": ["results.json", "attributions_*.npz", "cave.safetensors", "concept_maps.png",
                        "concepts_on_mesh_*.png", "run.json"]}


def _formal_inputs(typed: dict) -> dict:
    return {"model": typed["model"], "data": typed["data"]}


# FAME and its VeriX/VERIX+ baseline (toolkit/explain/methods/, one file each): the same images, box, attack and
# MILP check; each adds its own search knobs. A new explainer registered there appears here by itself.
for _entry in registry("explain"):
    config_command(app, _entry.name, config=_entry.config, run=_entry.obj, plan=_formal_plan,
                   technique=f"explain.{_entry.name}", help=_entry.meta["help"], epilog=_entry.meta.get("epilog"),
                   flags=[*FORMAL_FLAGS, *_entry.meta.get("flags", []), *FORMAL_TAIL], inputs=_formal_inputs)

config_command(
    app, "cave", config=CaveConfig, run="toolkit.explain.cave_run:run", plan=_cave_plan, technique="explain.cave",
    help="CAVE (arXiv 2503.13429): neural object volumes + sparse 3D concepts; trains, scores accuracy on OOD splits "
         "and 3D-C against 2D CNN baselines (NMF concepts, Grad-CAM).",
    epilog="Examples: iclrkit explain cave --out runs/cave | iclrkit explain cave -d runs/cave/dataset.npz "
           "--epochs 10 --set concepts_per_class=20 --out runs/cave2",
    flags=["data", "epochs", "concepts_per_class", "classifier", "baselines"],
    inputs=lambda typed: {"data": typed["data"].removeprefix("pascal3d:")
                          if typed["data"] and typed["data"] != "synthetic" else None})

config_command(app, "consistency", config=ConsistencyConfig, run="toolkit.explain.consistency:run",
               technique="explain.consistency", flags=["data", "attributions", "method"], optional_out=True,
               needs_out=False, inputs=lambda typed: {"data": typed["data"], "attributions": typed["attributions"]},
               help="3D consistency (3D-C) of any concept method's attribution maps, projected onto the "
                    "ground-truth meshes through the dataset's pix_to_face maps.",
               epilog="Examples: iclrkit explain consistency -d runs/cave/dataset.npz "
                      "--attributions runs/cave/attributions_cave.npz --json")
