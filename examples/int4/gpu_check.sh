#!/usr/bin/env bash
# Prepared H200 (sm_90) check for the INT4 Tensor Core kernels; not run on the CPU machines.
# Needs a CUDA build of torch in $PY. Steps: build toolkit._C with CUDA, bit-exactness tests against the integer
# reference, then timings at 4096x4096, m = 1 and 32, against FP16 cuBLAS (torch.nn.functional.linear).
# Results: ${OUT:-runs/int4-gpu}/int4_gpu.json. Budget: build ~3 min, tests + timing < 1 min.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
RESULTS=${OUT:-runs/int4-gpu}
mkdir -p "$RESULTS"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
ICLRKIT_BUILD_CUDA=1 TORCH_CUDA_ARCH_LIST="8.0;9.0" $PY setup.py -q build_ext --inplace 2>&1 | tail -5
$PY -m pytest -q tests/gpu/test_int4_cuda.py 2>&1 | tail -15 | tee "$RESULTS/pytest.txt"
$PY - "$RESULTS/int4_gpu.json" <<'PYEOF'
import json
import sys

import torch

from toolkit.ops.int4 import cuda_24_layout, cuda_dense_layout, pack_24, padded

n = k = 4096
g = torch.Generator().manual_seed(0)
codes = torch.randint(-8, 8, (n, k // 4, 4), generator=g, dtype=torch.int16)
codes.scatter_(-1, torch.rand(codes.shape, generator=g).argsort(-1)[..., :2], 0)
codes = codes.reshape(n, k)
scales = torch.rand(n, generator=g) * 0.01 + 0.001
w16 = (codes.float() * scales[:, None]).half().cuda()
w_dense = cuda_dense_layout(codes).cuda()
values, meta = cuda_24_layout(pack_24(codes, scales))
values, meta, ws = values.cuda(), meta.contiguous().cuda(), scales.cuda()


def time_ms(fn, iters=50):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


rows = []
for m in (1, 32):
    x16 = torch.randn(m, k, generator=g).half().cuda()
    x4 = cuda_dense_layout(torch.randint(-7, 8, (m, k), generator=g, dtype=torch.int8)).cuda()
    x8 = torch.randint(-127, 128, (m, padded(k)), generator=g, dtype=torch.int8).cuda()
    xs = torch.rand(m).cuda() + 0.1
    timings = {"fp16_cublas": time_ms(lambda: torch.nn.functional.linear(x16, w16)),
               "int4_mma_w4a4": time_ms(lambda: torch.ops.iclrkit.int4_gemm_cuda(x4, xs, w_dense, ws, k)),
               "int4_mma_sp_24_w4a8": time_ms(lambda: torch.ops.iclrkit.int4_gemm_24_cuda(x8, xs, values, meta, ws,
                                                                                          padded(k)))}
    for kernel, ms in timings.items():
        rows.append({"kernel": kernel, "m": m, "n": n, "k": k, "ms": round(ms, 5),
                     "speedup_vs_fp16": round(timings["fp16_cublas"] / ms, 3)})
json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, open(sys.argv[1], "w"), indent=2)
for r in rows:
    print(r)
PYEOF
