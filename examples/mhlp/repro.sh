#!/usr/bin/env bash
# MHLP repro: exact TV check with a scripted proposer + a scripted calibration task (seconds on CPU).
set -euo pipefail
cd "$(dirname "$0")/../.."
.venv/bin/python examples/mhlp/repro.py --out runs/repro-mhlp "$@"
