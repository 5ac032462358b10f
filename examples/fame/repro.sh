#!/usr/bin/env bash
# FAME vs a VeriX-style baseline (same CROWN oracle) on zoo:digits-mlp and zoo:digits-cnn, eps = 0.05,
# 100 test images each (correctly classified and not already certified on the whole box, as in the paper).
# Writes runs/repro-fame/results.json and prints the table. ~15-20 min on 2 shared cores.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
OUT=runs/repro-fame
N=${FAME_N:-100}
EXACT_N=${FAME_EXACT_N:-30}   # images for the exact-oracle VeriX ground truth (64 MILPs per image)
export OMP_NUM_THREADS=1      # tiny float64 matmuls: one thread is much faster on a loaded CPU
rm -rf "$OUT" && mkdir -p "$OUT"
run() { "$PY" -m cli.main -q explain "$@" --config examples/fame/config.yaml --json > /dev/null; }
for model in digits-mlp digits-cnn; do
  "$PY" -m cli.main -q zoo build "$model" > /dev/null
  run fame  -m "zoo:$model" -n "$N" --verify exact --out "$OUT/$model-fame"
  run verix -m "zoo:$model" -n "$N" --verify exact --out "$OUT/$model-verix"
done
# Ground truth on the MLP: VeriX with the exact MILP oracle (subset-minimal), and FAME + exact refinement of the
# undecided pixels, on the first EXACT_N qualifying images.
run verix -m zoo:digits-mlp -n "$EXACT_N" --oracle exact --verify none --out "$OUT/digits-mlp-verix-exact"
run fame  -m zoo:digits-mlp -n "$EXACT_N" --refine exact --verify none --out "$OUT/digits-mlp-fame-refine"
# How far from minimal the CNN explanations really are (the attack proves few pixels necessary there).
run fame  -m zoo:digits-cnn -n "$EXACT_N" --refine exact --verify none --out "$OUT/digits-cnn-fame-refine"
"$PY" examples/fame/collect.py "$OUT"
