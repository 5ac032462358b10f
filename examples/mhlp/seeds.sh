#!/usr/bin/env bash
# Issue 30: MHLP vs the single best prompt over seeds on SST-2 with zoo:smollm2-135m (examples/mhlp/smollm2_seeds.yaml:
# 50 evaluation reviews, 8 MH steps). Usage: bash examples/mhlp/seeds.sh [SEED ...] (default 0 1 2 3 4); then
# .venv/bin/python examples/mhlp/seeds_table.py runs/mhlp-seeds summarises them (mean ± sd).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-runs/mhlp-seeds}
CONFIG=${CONFIG:-examples/mhlp/smollm2_seeds.yaml}
mkdir -p "$OUT"
[ -f "$OUT/sst2.jsonl" ] || $PY examples/mhlp/sst2.py --out "$OUT/sst2.jsonl" --per-class 53
for seed in "${@:-0 1 2 3 4}"; do
  for s in $seed; do
    OMP_NUM_THREADS=1 nice -n 10 $PY -m cli.main -q prompt mhlp --task-model zoo:smollm2-135m \
      --proposer-model zoo:smollm2-135m --config "$CONFIG" -d "$OUT/sst2.jsonl" --seed "$s" \
      -o "$OUT/seed$s" --overwrite --json > "$OUT/seed$s.json"
  done
done
