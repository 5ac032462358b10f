"""`iclrkit segment mbunet train | convert | infer | bench`: masked binary U-Net on bit-packed kernels.

Options come from the configs' fields (toolkit/segment/config.py): each knob is declared once, there."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import typer

from cli._fields import config_command
from toolkit.segment.config import BenchConfig, ConvertConfig, InferConfig, MBUNetTrainConfig

app = typer.Typer(no_args_is_help=True, help="Image segmentation.")
mbunet = typer.Typer(no_args_is_help=True,
                     help="MBU-Net: masked binary U-Net ({-1,0,+1}·α weights, sign activations, packed kernels).")
app.add_typer(mbunet, name="mbunet")
NO_DEVICE = ("out", "config", "set_", "seed", "dry_run", "json_", "overwrite")


def _plan(config, ctx) -> dict:
    return {"model": getattr(config, "model", None), "data": getattr(config, "data", None)}


def _data(typed: dict) -> str | None:
    return typed["data"] if typed["data"] and typed["data"] != "procedural" else None


def _on_device(default: str | None, forced: bool = False):
    """Run with the command's device: `forced` (convert packs on the CPU) or `default` when --device is not given."""

    def run(**job: Any) -> None:
        from cli._runner import execute

        common = job["common"]
        device = default if forced else (common.device or default)
        execute(**{**job, "common": replace(common, device=device)})

    return run


config_command(
    mbunet, "train", config=MBUNetTrainConfig, run="toolkit.segment.train:train", plan=_plan,
    technique="segment.mbunet.train", help="Train a masked-binary (cost-aware masks), plain binary or fp32 U-Net.",
    epilog="Examples: iclrkit segment mbunet train --data procedural --variant masked --out runs/mb | "
           "iclrkit segment mbunet train -d ./pets --variant binary --steps 3000 --size 128 -o runs/bin",
    flags=["data", "variant", "steps", "size", "width", "num_classes", "mask_budget"],
    inputs=lambda typed: {"data": _data(typed)})

config_command(
    mbunet, "convert", config=ConvertConfig, run="toolkit.segment.run:run_convert", plan=_plan,
    technique="segment.mbunet.convert", help="Pack a trained model: bit planes + BN folded into integer thresholds.",
    epilog="Examples: iclrkit segment mbunet convert --model runs/mb --out runs/mb-packed",
    flags=["model", "check_images"], common=NO_DEVICE, inputs=lambda typed: {"model": typed["model"]},
    execute_with=_on_device("cpu", forced=True))

config_command(
    mbunet, "infer", config=InferConfig, run="toolkit.segment.run:run_infer", plan=_plan,
    technique="segment.mbunet.infer", help="Segment images; writes PNG masks and overlays; mIoU when masks exist.",
    epilog="Examples: iclrkit segment mbunet infer --model runs/mb-packed --data ./photos --out runs/pred | "
           "iclrkit segment mbunet infer -m runs/mb-packed -d procedural --limit 4 -o runs/demo --json",
    flags=["model", "data", "size", "limit"], inputs=lambda typed: {"model": typed["model"], "data": _data(typed)})

config_command(
    mbunet, "bench", config=BenchConfig, run="toolkit.segment.run:run_bench", plan=_plan,
    technique="segment.mbunet.bench", help="Time packed binary layers vs torch fp32 conv2d (batch 1).",
    epilog="Examples: iclrkit segment mbunet bench --model runs/mb-packed --size 256 --threads 2",
    flags=["model", "size", "repeats", "threads"], optional_out=True, needs_out=False,
    inputs=lambda typed: {"model": typed["model"]}, execute_with=_on_device("cpu"))
