#!/usr/bin/env bash
# make repro-prism: memorise a small MUSE-News subset with a zoo GPT-2, unlearn it with GA / NPO / RMU / PRISM (and
# PRISM ablations), evaluate, attack; writes runs/repro-prism/results.json and prints the table. Sizes: RESULTS.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"  # shared CPUs: one thread per process
mkdir -p runs/repro-prism
.venv/bin/python examples/prism/bench.py --out runs/repro-prism "$@"
