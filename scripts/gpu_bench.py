"""Kernel timings for `make gpu-check` (scripts/gpu-check.sh), runnable on any device with any shapes:

- INT4 weight matmul (W4A16 weight-only, W4A8 dense, W4A8 2:4; activation quantisation included for W4A8) against
  the dense 16-bit linear of the same weights (cuBLAS FP16 on CUDA);
- the packed MBU-Net binary/ternary layers (fused threshold + bit packing) against FP16 conv2d of the same shapes
  (cuDNN on CUDA), each layer on its real input.

On CUDA each figure is the median of CUDA-event-timed batches; on the CPU the best of wall-clock repeats. The CPU
run with tiny shapes exists so the suite can exercise this code (tests/unit/test_int4_gpu_bench.py); its figures
mean nothing. Usage: python scripts/gpu_bench.py --device cuda --out results.json [--quick]. A script rather than
part of toolkit.ops: it times the MBU-Net layers too, and the kernel layer imports no technique.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import replace

import torch

INT4_SHAPES = ((4096, 4096), (11008, 4096), (4096, 11008))  # (N out, K in): attention/MLP projections of a 7B model
INT4_MS = (1, 16, 128, 4096)


def time_ms(fn: Callable[[], object], device: torch.device, iters: int = 20, warmup: int = 3) -> float:
    """Milliseconds per call: median of 5 CUDA-event-timed batches of `iters` calls, or the best of `iters`
    wall-clock calls on the CPU."""
    for _ in range(warmup):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        batches = []
        for _ in range(5):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                fn()
            end.record()
            torch.cuda.synchronize(device)
            batches.append(start.elapsed_time(end) / iters)
        return statistics.median(batches)
    best = float("inf")
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        best = min(best, (time.perf_counter() - start) * 1e3)
    return best


def _random_24(n: int, k: int, generator: torch.Generator) -> torch.Tensor:
    codes = torch.randint(-8, 8, (n, k // 4, 4), generator=generator, dtype=torch.int16)
    drop = torch.rand(codes.shape, generator=generator).argsort(-1)[..., :2]
    return codes.scatter_(-1, drop, 0).reshape(n, k)


def int4_rows(device: str | torch.device, shapes=INT4_SHAPES, ms=INT4_MS, dtype: torch.dtype | None = None,
              iters: int = 20, seed: int = 0) -> list[dict]:
    """One row per (kernel, n, k, m): ms and the speed-up over the dense 16-bit linear (`dense_ms`)."""
    from toolkit.ops.int4 import int4_gemm, pack_24, pack_dense, quantize_activations
    from toolkit.ops.w4a16 import w4a16_gemm, w4a16_layout

    device = torch.device(device)
    dtype = dtype or (torch.float16 if device.type == "cuda" else torch.float32)
    g = torch.Generator().manual_seed(seed)
    rows = []
    for n, k in shapes:
        codes = _random_24(n, k, g)
        scales = torch.rand(n, generator=g) * 0.01 + 0.001
        weight = (codes.float() * scales[:, None]).to(device, dtype)
        w16 = w4a16_layout(codes, scales)
        w16 = replace(w16, packed=w16.packed.to(device), scales=w16.scales.to(device))
        moved = {}
        for name, weights in (("w4a8_dense", pack_dense(codes, scales)), ("w4a8_24", pack_24(codes, scales))):
            moved[name] = replace(weights, packed=weights.packed.to(device), scales=weights.scales.to(device),
                                  rowsum=weights.rowsum.to(device),
                                  meta=None if weights.meta is None else weights.meta.to(device))
        for m in ms:
            x = torch.randn(m, k, generator=g).to(device, dtype)

            def w4a8(name, x=x):
                xq, xs = quantize_activations(x, 8)
                return int4_gemm(xq, xs, moved[name])

            contestants = {"dense": lambda x=x: torch.nn.functional.linear(x, weight),
                           "w4a16": lambda x=x: w4a16_gemm(x, w16),
                           "w4a8_dense": lambda: w4a8("w4a8_dense"), "w4a8_24": lambda: w4a8("w4a8_24")}
            calls = iters if m <= 128 else max(2, iters // 5)  # prefill-sized m: fewer calls keep the budget
            with torch.inference_mode():
                timings = {name: time_ms(fn, device, calls) for name, fn in contestants.items()}
            for name in ("w4a16", "w4a8_dense", "w4a8_24"):
                rows.append({"kernel": name, "n": n, "k": k, "m": m, "ms": round(timings[name], 5),
                             "dense_ms": round(timings["dense"], 5), "dense_dtype": str(dtype).replace("torch.", ""),
                             "speedup_vs_dense": round(timings["dense"] / timings[name], 3)})
    return rows


def binary_conv_rows(device: str | torch.device, width: int = 32, depth: int = 3, size: int = 256,
                     dtype: torch.dtype | None = None, iters: int = 20, seed: int = 0) -> dict:
    """Every packed layer of a random masked MBU-Net (width, depth) at size x size, batch 1, on its real input,
    against `dtype` conv2d of the same shape (float ±1 input, the layer's {-1, 0, +1} weights); plus the whole
    network (packed vs the fp U-Net of the same architecture)."""
    import torch.nn.functional as F

    from toolkit.segment import kernels
    from toolkit.segment.mbunet import UNet
    from toolkit.segment.packed import convert

    device = torch.device(device)
    dtype = dtype or (torch.float16 if device.type == "cuda" else torch.float32)
    torch.manual_seed(seed)
    model = UNet(width, depth, 4, "masked").eval()
    packed = convert(model).to(device)
    x = torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(seed)).to(device)
    record: dict[str, torch.Tensor] = {}
    packed.features(x, record)
    rows, dense_total, packed_total = [], 0.0, 0.0
    with torch.inference_mode():
        for name, bits in record.items():
            layer = packed.layers[name]
            act = kernels.unpack_sign(bits, layer.segments).to(dtype).contiguous()
            weight = kernels.planes_to_weight(layer.pos, layer.neg, layer.segments).to(dtype)
            dense_ms = time_ms(lambda act=act, weight=weight: F.conv2d(act, weight, padding=1), device, iters)
            packed_ms = time_ms(lambda layer=layer, bits=bits: layer(bits), device, iters)
            rows.append({"layer": name, "shape": list(act.shape), "out_channels": int(weight.shape[0]),
                         "binary": layer.binary, "dense_ms": round(dense_ms, 5), "packed_ms": round(packed_ms, 5),
                         "speedup_vs_dense": round(dense_ms / packed_ms, 3)})
            dense_total += dense_ms
            packed_total += packed_ms
        reference = UNet(width, depth, 4, "fp32").eval().to(device, dtype)
        network_dense = time_ms(lambda: reference(x.to(dtype)), device, iters)
        network_packed = time_ms(lambda: packed(x), device, iters)
    return {"width": width, "depth": depth, "size": size, "dense_dtype": str(dtype).replace("torch.", ""),
            "layers_dense_ms": round(dense_total, 5), "layers_packed_ms": round(packed_total, 5),
            "layers_speedup": round(dense_total / packed_total, 3), "network_dense_ms": round(network_dense, 5),
            "network_packed_ms": round(network_packed, 5), "network_speedup": round(network_dense / network_packed, 3),
            "layers": rows}


def run(device: str, quick: bool = False, iters: int = 20) -> dict:
    from toolkit.ops import compiled_devices

    dev = torch.device(device)
    if quick:
        int4 = int4_rows(dev, shapes=((32, 128),), ms=(1, 3), iters=2)
        conv = binary_conv_rows(dev, width=8, depth=1, size=16, iters=2)
    else:
        int4 = int4_rows(dev, iters=iters)
        conv = binary_conv_rows(dev, iters=iters)
    kernels = {name: compiled_devices(name) for name in ("int4_gemm", "int4_gemm_24", "int4_gemm_s4", "w4a16_gemm",
                                                          "ternary_conv2d", "ternary_conv2d_sign", "pack_sign")}
    return {"device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu", "torch": torch.__version__,
            "cuda": torch.version.cuda, "quick": quick, "compiled_kernels": kernels, "int4": int4,
            "binary_conv": conv}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", required=True)
    parser.add_argument("--quick", action="store_true", help="tiny shapes (a smoke run; figures mean nothing)")
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args(argv)
    result = run(args.device, args.quick, args.iters)
    with open(args.out, "w") as handle:
        json.dump(result, handle, indent=2)
    for row in result["int4"]:
        print(f"int4 {row['kernel']:10s} n={row['n']:5d} k={row['k']:5d} m={row['m']:4d} {row['ms']:.4f} ms "
              f"x{row['speedup_vs_dense']} vs {row['dense_dtype']}")
    conv = result["binary_conv"]
    print(f"binary conv layers x{conv['layers_speedup']} vs {conv['dense_dtype']} conv2d, network "
          f"x{conv['network_speedup']}")
    return 0


if __name__ == "__main__":
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the project root, installed or not
    raise SystemExit(main())
