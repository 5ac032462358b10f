#!/usr/bin/env bash
# make repro-int4: the packed INT4 GEMM kernels (W4A8, dense and 2:4) against torch FP32 at 4096x4096 with m=1 and
# m=32, then a 2:4 OBR-packed llama-small decoded on the kernels against its FP32 twin.
# Writes runs/repro-int4/results.json and prints the table. Kernels are timed interleaved, best of N.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
OUT=runs/repro-int4
MODEL=${INT4_MODEL:-zoo:llama-small}
REPEATS=${INT4_REPEATS:-10}
# Spinning OpenMP workers (the default ACTIVE wait) of our pool and torch's fight for the 2 shared cores and make
# every kernel 10-30x slower at m=1 on a loaded machine; PASSIVE lets idle workers sleep.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
mkdir -p "$OUT"
if ! $PY -c "from toolkit.ops import has_op; assert has_op('int4_gemm')" 2>/dev/null; then
  $PY setup.py -q build_ext --inplace
fi
PACKED="$OUT/obr-llama-small/packed"
if [ ! -f "$PACKED/model.packed.safetensors" ]; then
  OMP_NUM_THREADS=2 .venv/bin/iclrkit compress obr --model "$MODEL" --data embedded --w-bits 4 --a-bits 16 \
    --kv-bits 16 --nm 2:4 --nsamples 8 --seqlen 128 --set export=packed --set embed_bits=8 --eval-data embedded \
    --set eval_windows=4 --set eval_max_length=256 --out "$OUT/obr-llama-small" --overwrite
fi
$PY - "$PACKED" "$OUT/bench" "$REPEATS" <<'PYEOF'
import sys

import typer

from cli.compress_bench import bench

app = typer.Typer()
app.command()(bench)
packed, out, repeats = sys.argv[1:4]
app(["--model", packed, "--rows", "1", "--rows", "32", "--repeats", repeats, "--out", out, "--overwrite"],
    standalone_mode=False)
PYEOF
cp "$OUT/bench/results.json" "$OUT/results.json"
$PY - "$OUT/results.json" <<'PYEOF'
import json
import sys

d = json.load(open(sys.argv[1]))
print(f"{'kernel':<15}{'m':>4}{'n':>6}{'k':>6}{'ms':>10}{'fp32 ms':>10}{'x fp32':>9}{'x dense':>9}")
for r in d["rows"]:
    print(f"{r['kernel']:<15}{r['m']:>4}{r['n']:>6}{r['k']:>6}{r['ms']:>10.3f}{r['fp32_ms']:>10.3f}"
          f"{r['speedup_vs_fp32']:>9.2f}{r['speedup_vs_dense']:>9.2f}")
for key, value in d.get("model", {}).items():
    print(f"model.{key}: {value}")
PYEOF
