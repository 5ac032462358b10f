#!/usr/bin/env bash
# Issue 30: the binary-network levers on the masked MBU-Net, small (STEPS=300 by default instead of the repro's
# 1200; same 32x32 procedural scenes, width 16). One stream per seed: bash examples/mbunet/levers.sh SEED.
# Rows: fp32 (also the distillation teacher), masked, +shortcut (Bi-Real), +RSign/RPReLU (ReActNet),
# +two-stage (30% of the steps with real activations), +distillation (0.5 CE + 0.5 KD from the fp32 run).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
SEED=${1:-0}
STEPS=${STEPS:-300}
R=${OUT:-runs/mbunet-levers}/seed$SEED
mkdir -p "$R"
export OMP_NUM_THREADS=1
COMMON=(--data procedural --config examples/mbunet/config.yaml --steps "$STEPS" --seed "$SEED" --overwrite)
train() {  # name variant [--set k=v ...]
  local name=$1 variant=$2; shift 2
  [ -f "$R/$name/run.json" ] && return 0
  nice -n 10 $PY -m cli.main -q segment mbunet train --variant "$variant" "${COMMON[@]}" "$@" --out "$R/$name" \
    > "$R/$name.log" 2>&1
}
train fp32 fp32
train masked masked
train shortcut masked --set shortcut=true
train reactnet masked --set shortcut=true --set learnable=true
train reactnet-2stage masked --set shortcut=true --set learnable=true --set two_stage=0.3
train reactnet-kd masked --set shortcut=true --set learnable=true --set distill=0.5 --set "teacher=$R/fp32"
