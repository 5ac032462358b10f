#!/usr/bin/env bash
# ONE prepared device check for csrc/binary on an H200 (sm_90): builds the CPU + CUDA kernels against the machine's
# CUDA torch (torch.utils.cpp_extension.load, only csrc/binary), checks the binary Tensor Core kernel bit-exact vs the
# float reference and the CPU kernel on odd shapes (both ternary and binary weights, stride, padding), and times it vs
# cuDNN FP16 conv2d. Writes $OUT/gpu_check.json and $OUT/gpu_check.log. Needs only torch + numpy (no pydantic).
# Run from the repository root:  bash examples/mbunet/gpu_check.sh   (about 3-5 minutes, mostly the build)
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-runs/gpu-check}"
mkdir -p "$OUT"
export CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}" TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}"
export MAX_JOBS="${MAX_JOBS:-16}" PYTHONUNBUFFERED=1 TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-/tmp/iclrkit-ext}"
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv 2>&1 | tee "$OUT/gpu_check.log"
timeout 540 python3 examples/mbunet/gpu_check.py --out "$OUT" 2>&1 | tee -a "$OUT/gpu_check.log"
