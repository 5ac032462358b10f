"""Device check for csrc/binary on a CUDA GPU (written for an H200, sm_90): builds the CPU + CUDA kernels with the
local CUDA torch, checks the Tensor Core kernel bit-exact against the float reference and the CPU kernel, then times
it against cuDNN FP16 conv2d at the same shapes. Imports only torch, numpy and toolkit.segment.kernels.

Usage: python3 examples/mbunet/gpu_check.py --out DIR   (writes DIR/gpu_check.json)
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def build() -> float:
    from torch.utils.cpp_extension import load

    start = time.time()
    arch = os.environ.get("GPU_ARCH", "90")
    src = ROOT / "csrc" / "binary"
    load(name="iclrkit_binary_check",
         sources=[str(src / "ternary_conv.cpp"), str(src / "ternary_conv_cuda_ops.cpp"),
                  str(src / "ternary_conv_cuda.cu")],
         extra_cflags=["-O3", "-std=c++17", "-fopenmp", "-DICLRKIT_WITH_CUDA"],
         extra_cuda_cflags=["-O3", "-std=c++17", f"-gencode=arch=compute_{arch},code=sm_{arch}"],
         extra_ldflags=["-fopenmp"], is_python_module=False, verbose=False)
    return time.time() - start


def exactness(kernels) -> list:
    rows = []
    cases = [(1, 3, 5, 7, 9, 3, 1, 1), (3, 130, 70, 9, 8, 3, 2, 1), (2, 64, 33, 6, 6, 3, 1, 0),
             (8, 128, 128, 32, 32, 3, 1, 1), (1, 200, 40, 11, 13, 1, 1, 0), (2, 17, 96, 15, 15, 3, 1, 2)]
    for n, cin, out_ch, h, w, k, stride, pad in cases:
        for ternary in (True, False):
            g = torch.Generator().manual_seed(cin * 31 + out_ch)
            act = torch.randint(0, 2, (n, cin, h, w), generator=g).float() * 2 - 1
            q = torch.randint(-1 if ternary else 0, 2, (out_ch, cin, k, k), generator=g).float()
            q = q if ternary else q * 2 - 1
            bits = kernels.pack_sign_reference(act)
            pos, neg = kernels.weight_planes(q)
            want = F.conv2d(act.double(), q.double(), stride=stride, padding=pad).round().int().permute(0, 2, 3, 1)
            cpu = torch.ops.iclrkit.ternary_conv2d(bits, pos, neg, stride, pad, not ternary, 0)
            gpu = torch.ops.iclrkit.ternary_conv2d(bits.cuda(), pos.cuda(), neg.cuda(), stride, pad, not ternary, 0)
            thr = torch.randint(-20, 21, (out_ch,), generator=g)
            flip = torch.rand(out_ch, generator=g) < 0.5
            gbits = torch.ops.iclrkit.ternary_conv2d_sign(bits.cuda(), pos.cuda(), neg.cuda(), thr.cuda(),
                                                          flip.cuda(), stride, pad, not ternary, 0).cpu()
            rows.append({"shape": [n, cin, out_ch, h, w, k, stride, pad], "ternary": ternary,
                         "gpu_exact": bool(torch.equal(gpu.cpu(), want.contiguous())),
                         "cpu_exact": bool(torch.equal(cpu, want.contiguous())),
                         "bits_exact": bool(torch.equal(gbits, kernels.pack_bool(
                             kernels.threshold_bits(want, thr, flip))))})
            print(rows[-1], flush=True)
    return rows


def cuda_ms(fn, repeats=50) -> float:
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def timing(kernels) -> list:
    torch.backends.cudnn.benchmark = True
    rows = []
    for n, cin, out_ch, h, w in [(8, 128, 128, 32, 32), (1, 64, 64, 256, 256), (1, 128, 128, 128, 128),
                                 (16, 256, 256, 64, 64), (128, 128, 128, 64, 64)]:
        g = torch.Generator().manual_seed(0)
        act = torch.randint(0, 2, (n, cin, h, w), generator=g).float() * 2 - 1
        q = torch.randint(-1, 2, (out_ch, cin, 3, 3), generator=g).float()
        bits = kernels.pack_sign_reference(act).cuda()
        pos, neg = (p.cuda() for p in kernels.weight_planes(q))
        qb = torch.where(q >= 0, 1.0, -1.0)
        bpos, bneg = (p.cuda() for p in kernels.weight_planes(qb))
        x16, w16 = act.cuda().half(), q.cuda().half()
        x16_cl = x16.to(memory_format=torch.channels_last)
        row = {"shape": [n, cin, out_ch, h, w],
               "ternary_ms": cuda_ms(lambda: torch.ops.iclrkit.ternary_conv2d(bits, pos, neg, 1, 1, False, 0)),
               "binary_ms": cuda_ms(lambda: torch.ops.iclrkit.ternary_conv2d(bits, bpos, bneg, 1, 1, True, 0)),
               "cudnn_fp16_ms": cuda_ms(lambda: F.conv2d(x16, w16, padding=1)),
               "cudnn_fp16_channels_last_ms": cuda_ms(lambda: F.conv2d(x16_cl, w16.to(
                   memory_format=torch.channels_last), padding=1))}
        row["ternary_speedup_vs_fp16"] = min(row["cudnn_fp16_ms"], row["cudnn_fp16_channels_last_ms"]) / row["ternary_ms"]
        rows.append(row)
        print(row, flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="runs/gpu-check")
    out = Path(parser.parse_args().out)
    out.mkdir(parents=True, exist_ok=True)
    report = {"torch": torch.__version__, "cuda": torch.version.cuda,
              "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
    print(report, flush=True)
    if not torch.cuda.is_available():
        print("no CUDA device")
        return 1
    report["build_s"] = build()
    from toolkit.segment import kernels

    report["exact"] = exactness(kernels)
    report["all_exact"] = all(r["gpu_exact"] and r["cpu_exact"] and r["bits_exact"] for r in report["exact"])
    report["timing"] = timing(kernels)
    (out / "gpu_check.json").write_text(json.dumps(report, indent=2))
    print("ALL EXACT" if report["all_exact"] else "MISMATCH", flush=True)
    return 0 if report["all_exact"] else 1


if __name__ == "__main__":
    sys.exit(main())
