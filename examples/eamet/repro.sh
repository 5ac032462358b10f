#!/usr/bin/env bash
# MEMIT vs EAMET, one run: writes runs/repro-eamet/results.json and prints the table.
# Sizes: SMOL_N (default "100") edits on zoo:smollm2-135m, GPT2_N (default "1000 3000") on zoo:gpt2-small;
# SMOL_SET / GPT2_SET add CLI flags (e.g. "--set v_num_grad_steps=10").
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
PY="${PY:-.venv/bin/python}"
"$PY" examples/eamet/bench.py
