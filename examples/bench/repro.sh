#!/usr/bin/env bash
# make repro-videomathqa | make repro-mmsearch -> bash examples/bench/repro.sh NAME: (a) the harness against a
# scripted model behind the loopback server (hand-computed scores), (c) the same outputs at --concurrency 1 and 4,
# and with SMOL=1 (default) (b) the real zoo:smollm2-135m (text-only) on the synthetic fixtures. Writes
# runs/repro-NAME/results.json and prints the table (a few minutes on 2 cores; SMOL=0: about one minute).
set -euo pipefail
NAME=${1:?usage: examples/bench/repro.sh videomathqa|mmsearch}
cd "$(dirname "$0")/../.."
rm -rf "runs/repro-$NAME" && mkdir -p "runs/repro-$NAME"
OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} SMOL=${SMOL:-1} .venv/bin/python examples/bench/repro.py "$NAME"
.venv/bin/python examples/bench/repro.py combine  # both harnesses' rows -> examples/bench/results.json
