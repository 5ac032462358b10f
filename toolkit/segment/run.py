"""run() functions for `iclrkit segment mbunet convert | infer | bench` (train lives in train.py)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from toolkit.core.errors import BadInputError
from toolkit.segment.config import BenchConfig, ConvertConfig, InferConfig
from toolkit.segment.mbunet import (
    ARCH_FILE,
    iou_per_class,
    load_model,
    mean_iou,
    predict,
)
from toolkit.segment.packed import (
    PACKED_FILE,
    convert,
    float_model_bytes,
    load_packed,
    save_packed,
    time_layers,
)

PALETTE = [(0, 0, 0), (230, 25, 75), (60, 180, 75), (255, 225, 25), (0, 130, 200), (245, 130, 48),
           (145, 30, 180), (70, 240, 240), (240, 50, 230), (210, 245, 60)]


def _model_kind(path: str) -> str:
    root = Path(path)
    if (root / PACKED_FILE).is_file():
        return "packed"
    if (root / ARCH_FILE).is_file():
        return "float"
    raise BadInputError(f"{path} is not an MBU-Net directory", "train one with `iclrkit segment mbunet train`")


def run_convert(config: ConvertConfig, ctx) -> dict:
    from toolkit.segment.data import procedural_scenes

    model, arch = load_model(config.model)
    packed = convert(model)
    sizes = save_packed(packed, ctx.out, {k: arch[k] for k in ("class_names", "size") if k in arch})
    ctx.artifacts += [PACKED_FILE, ARCH_FILE]
    metrics = {"float_kb": float_model_bytes(model) / 1024, "packed_kb": sizes["packed_bytes"] / 1024,
               "binary_layers_kb": sizes["binary_layer_bytes"] / 1024,
               "masked_layers": sum(not layer.binary for layer in packed.layers.values()),
               "layers": len(packed.layers)}
    metrics["compression"] = metrics["float_kb"] / metrics["packed_kb"]
    if config.check_images:
        images = procedural_scenes(config.check_images, size=arch.get("size", 64), seed=ctx.seed).images
        with torch.no_grad():
            reference, result = model(images), packed(images)
        metrics["max_abs_logit_diff"] = float((reference - result).abs().max())
        metrics["exact"] = bool(torch.equal(reference, result))
    ctx.metrics.update(metrics)
    return metrics


def _save_png(array, path: Path, palette: bool) -> None:
    from PIL import Image

    if palette:
        image = Image.fromarray(array.astype("uint8"), mode="P")
        image.putpalette(([c for rgb in PALETTE for c in rgb] * (256 // len(PALETTE) + 1))[:768])
    else:
        image = Image.fromarray(array.astype("uint8"))
    image.save(path)


def run_infer(config: InferConfig, ctx) -> dict:
    import numpy as np

    from toolkit.segment.data import load_dataset

    kind = _model_kind(config.model)
    model, arch = load_packed(config.model) if kind == "packed" else load_model(config.model)
    size = config.size or arch.get("size", 64)
    if size % 2 ** arch["depth"]:
        raise BadInputError(f"size {size} must be a multiple of 2^depth = {2 ** arch['depth']}")
    data = load_dataset(config.data, size, arch["num_classes"], config.n_images, ctx.seed, require_masks=False)
    images, masks = data.images, data.masks
    if config.limit:
        images, masks = images[:config.limit], None if masks is None else masks[:config.limit]
    device = ctx.device
    pred = predict(model.to(device), images, device=device)
    for i in range(len(images)):
        name = f"{i:05d}"
        _save_png(pred[i].numpy(), ctx.path(f"masks/{name}.png"), palette=True)
        if config.overlays:
            rgb = ((images[i].permute(1, 2, 0).numpy() + 0.5).clip(0, 1) * 255)
            colours = np.array(PALETTE * (arch["num_classes"] // len(PALETTE) + 1))[pred[i].numpy()]
            _save_png(rgb * (1 - config.alpha) + colours * config.alpha, ctx.path(f"overlays/{name}.png"), False)
    metrics: dict = {"backend": f"{kind}-{torch.device(device).type}", "images": len(images)}
    if masks is not None:
        per_class = iou_per_class(pred, masks, arch["num_classes"])
        names = arch.get("class_names") or [f"class{c}" for c in range(arch["num_classes"])]
        metrics["miou"] = mean_iou(per_class)
        metrics["iou"] = {n: (None if v is None else 100 * v) for n, v in zip(names, per_class)}
    ctx.metrics.update(metrics)
    return metrics


def run_bench(config: BenchConfig, ctx) -> dict:
    import time

    from toolkit.ops import has_op
    from toolkit.segment.mbunet import UNet

    kind = _model_kind(config.model)
    packed, arch = load_packed(config.model) if kind == "packed" else (convert(load_model(config.model)[0]), None)
    arch = arch or packed.arch
    device = torch.device(ctx.device)
    packed = packed.to(device)
    if config.size % 2 ** arch["depth"]:
        raise BadInputError(f"size {config.size} must be a multiple of 2^depth = {2 ** arch['depth']}")
    clock = time.thread_time if config.timer == "thread-cpu" else time.perf_counter
    if config.timer == "thread-cpu" and torch.get_num_threads() > 1:
        raise BadInputError("--set timer=thread-cpu measures one thread's CPU time; use it with --threads 1")
    layers = time_layers(packed, config.size, config.repeats, ctx.seed, clock)
    reference = UNet(arch["width"], arch["depth"], arch["num_classes"], "fp32").eval().to(device)
    x = torch.randn(1, 3, config.size, config.size).to(device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def best_ms(fn):
        with torch.no_grad():
            fn()
            sync()
            times = []
            for _ in range(config.repeats):
                start = clock()
                fn()
                sync()
                times.append((clock() - start) * 1000)
        return min(times)

    metrics = {"fp32_ms": layers["fp32_ms"], "packed_ms": layers["packed_ms"],
               "speedup": layers["fp32_ms"] / layers["packed_ms"],
               "network_fp32_ms": best_ms(lambda: reference(x)), "network_packed_ms": best_ms(lambda: packed(x)),
               "shape": f"1x3x{config.size}x{config.size}", "device": str(device),
               "threads": torch.get_num_threads(), "timer": config.timer,
               "compiled_kernel": has_op("ternary_conv2d_sign")}
    metrics["network_speedup"] = metrics["network_fp32_ms"] / metrics["network_packed_ms"]
    if ctx.out is not None:
        ctx.path("bench.json").write_text(json.dumps({**metrics, "layers": layers["layers"]}, indent=2))
    ctx.metrics.update(metrics)
    return metrics
