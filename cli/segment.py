"""`iclrkit segment mbunet train | convert | infer | bench`: masked binary U-Net on bit-packed kernels."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cli._options import (
    ConfigOpt,
    DeviceOpt,
    DryRunOpt,
    JsonOpt,
    OutOpt,
    OverwriteOpt,
    SeedOpt,
    SetOpt,
)
from cli._runner import Common, execute

app = typer.Typer(no_args_is_help=True, help="Image segmentation.")
mbunet = typer.Typer(no_args_is_help=True,
                     help="MBU-Net: masked binary U-Net ({-1,0,+1}·α weights, sign activations, packed kernels).")
app.add_typer(mbunet, name="mbunet")

SegDataOpt = Annotated[str | None, typer.Option(
    "--data", "-d", help="Folder with images/ and masks/ (PNG class indices), or 'procedural'.")]
ModelDirOpt = Annotated[str, typer.Option("--model", "-m", help="MBU-Net directory (trained, or packed).")]


def _plan(config, ctx) -> dict:
    return {"model": getattr(config, "model", None), "data": getattr(config, "data", None)}


@mbunet.command("train", help="Train a masked-binary (cost-aware masks), plain binary or fp32 U-Net.",
                epilog="Examples: iclrkit segment mbunet train --data procedural --variant masked --out runs/mb | "
                       "iclrkit segment mbunet train -d ./pets --variant binary --steps 3000 --size 128 -o runs/bin")
def train(
    data: SegDataOpt = None,
    variant: Annotated[str | None, typer.Option(help="masked | binary | fp32.")] = None,
    steps: Annotated[int | None, typer.Option(help="Training steps.")] = None,
    size: Annotated[int | None, typer.Option(help="Training resolution (multiple of 2^depth).")] = None,
    width: Annotated[int | None, typer.Option(help="Channels of the first level.")] = None,
    num_classes: Annotated[int | None, typer.Option(help="Classes (default: from the data).")] = None,
    mask_budget: Annotated[float | None, typer.Option(help="Extra bit-ops allowed for masks (x binary).")] = None,
    out: OutOpt = None, config: ConfigOpt = None, set_: SetOpt = None, seed: SeedOpt = None,
    device: DeviceOpt = None, dry_run: DryRunOpt = False, json_: JsonOpt = False, overwrite: OverwriteOpt = False,
) -> None:
    from toolkit.segment.train import MBUNetTrainConfig
    from toolkit.segment.train import train as run_train

    execute(technique="segment.mbunet.train", config_cls=MBUNetTrainConfig,
            flags={"data": data, "variant": variant, "steps": steps, "size": size, "width": width,
                   "num_classes": num_classes, "mask_budget": mask_budget},
            common=Common.of(locals()),
            run=run_train, inputs={"data": data if data and data != "procedural" else None}, plan=_plan)


@mbunet.command("convert", help="Pack a trained model: bit planes + BN folded into integer thresholds.",
                epilog="Examples: iclrkit segment mbunet convert --model runs/mb --out runs/mb-packed")
def convert(
    model: ModelDirOpt,
    check_images: Annotated[int | None, typer.Option(help="Procedural images for the exactness check.")] = None,
    out: OutOpt = None, config: ConfigOpt = None, set_: SetOpt = None, seed: SeedOpt = None,
    dry_run: DryRunOpt = False, json_: JsonOpt = False, overwrite: OverwriteOpt = False,
) -> None:
    from toolkit.segment.run import ConvertConfig, run_convert

    execute(technique="segment.mbunet.convert", config_cls=ConvertConfig,
            flags={"model": model, "check_images": check_images},
            common=Common.of(locals(), device='cpu'),
            run=run_convert, inputs={"model": model}, plan=_plan)


@mbunet.command("infer", help="Segment images; writes PNG masks and overlays; mIoU when masks exist.",
                epilog="Examples: iclrkit segment mbunet infer --model runs/mb-packed --data ./photos --out runs/pred | "
                       "iclrkit segment mbunet infer -m runs/mb-packed -d procedural --limit 4 -o runs/demo --json")
def infer(
    model: ModelDirOpt,
    data: SegDataOpt = None,
    size: Annotated[int | None, typer.Option(help="Resize images to size x size (default: training size).")] = None,
    limit: Annotated[int | None, typer.Option(help="Only the first N images.")] = None,
    out: OutOpt = None, config: ConfigOpt = None, set_: SetOpt = None, seed: SeedOpt = None,
    device: DeviceOpt = None, dry_run: DryRunOpt = False, json_: JsonOpt = False, overwrite: OverwriteOpt = False,
) -> None:
    from toolkit.segment.run import InferConfig, run_infer

    execute(technique="segment.mbunet.infer", config_cls=InferConfig,
            flags={"model": model, "data": data, "size": size, "limit": limit},
            common=Common.of(locals()),
            run=run_infer, inputs={"model": model, "data": data if data and data != "procedural" else None},
            plan=_plan)


@mbunet.command("bench", help="Time packed binary layers vs torch fp32 conv2d (batch 1).",
                epilog="Examples: iclrkit segment mbunet bench --model runs/mb-packed --size 256 --threads 2")
def bench(
    model: ModelDirOpt,
    size: Annotated[int | None, typer.Option(help="Input size (square).")] = None,
    repeats: Annotated[int | None, typer.Option(help="Timed repeats per layer (median).")] = None,
    threads: Annotated[int | None, typer.Option(help="CPU threads.")] = None,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Optional directory for bench.json.")] = None,
    config: ConfigOpt = None, set_: SetOpt = None, seed: SeedOpt = None, device: DeviceOpt = None,
    dry_run: DryRunOpt = False, json_: JsonOpt = False, overwrite: OverwriteOpt = False,
) -> None:
    from toolkit.segment.run import BenchConfig, run_bench

    execute(technique="segment.mbunet.bench", config_cls=BenchConfig,
            flags={"model": model, "size": size, "repeats": repeats, "threads": threads},
            common=Common.of(locals(), device=device or "cpu"),
            run=run_bench, inputs={"model": model}, plan=_plan, needs_out=False)
