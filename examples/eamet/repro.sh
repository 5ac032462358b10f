#!/usr/bin/env bash
# MEMIT vs EAMET, one run: writes runs/repro-eamet/results.json and prints the table.
# Sizes (the issue's by default): SMOL_N="100 1000" edits on zoo:smollm2-135m, GPT2_N="1000 3000" on
# zoo:gpt2-small. SMOL_SET / GPT2_SET add CLI flags per model, MEMIT_SET / EAMET_SET per method.
# EAMET's fix_ks bound ‖δ‖ ≤ 2‖k‖ is tuned for 7B models; on SmolLM2 (‖k‖ ≈ 7, ‖h‖ ≈ 100 at layer 4) it allows
# a seventh of MEMIT's 0.75‖h‖, so the repro scales it to the same order (clamp_factor 10).
# Rows already in results.json are kept; delete it to measure everything again.
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
export EAMET_SET="${EAMET_SET:---set clamp_factor=10}"
PY="${PY:-.venv/bin/python}"
"$PY" examples/eamet/bench.py
