#!/usr/bin/env bash
# make repro-merge-mergekit: iclrkit's registered merges against real mergekit 0.1.5 (its own venv, .venv-bench:
# mergekit is not an iclrkit dependency) -> runs/repro-merge-mergekit/results.json (~30 min on 2 shared cores).
set -euo pipefail
cd "$(dirname "$0")/../.."
BENCH=${BENCH_VENV:-.venv-bench}
if [ ! -x "$BENCH/bin/python" ] || ! "$BENCH/bin/python" -c "import mergekit" 2>/dev/null; then
  python3 -m venv "$BENCH"
  "$BENCH/bin/pip" install -q torch==2.13.0 mergekit==0.1.5   # one command: pip keeps the CPU torch
fi
mkdir -p runs/repro-merge-mergekit
OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python examples/merge-mergekit/bench.py --mergekit-python "$BENCH/bin/python" \
  --work runs/repro-merge-mergekit/work --results runs/repro-merge-mergekit/results.json
