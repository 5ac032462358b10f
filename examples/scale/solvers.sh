#!/usr/bin/env bash
# `make bench-obr-solvers` (issue 42): OBR's restoration solvers on the same layers, then the GPU plan.
#   1. capture the per-linear problems (examples/scale/capture.py) of SmolLM2-135M (rotated, W4A16 + 50 %, 16 x 256
#      tokens of WikiText-2 valid, blocks 0, 1, 14, 29) and of 2-block random-weight models of the 135M, 360M and
#      1.1B shapes (8 x 512 embedded tokens, mask + RTN between blocks: cost only);
#   2. examples/scale/solvers_study.py on each (the 360M and 1.1B shapes on block 1, first 512 / 256 rows: the
#      float64 Cholesky reference costs one factorization of ~C/2 per row);
#   3. examples/scale/gpu_plan.py (the projection from the measured iteration counts).
# Existing captures in runs/obr-problems are reused. One thread, nice 10.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
DATA=${DATA:-../shared/data}
WORK=${WORK:-runs/obr-problems}
export OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 MALLOC_MMAP_THRESHOLD_=1048576
RUN="nice -n 10 $PY"
mkdir -p "$WORK" runs/scale
[ -f "$WORK/smollm2/index.json" ] || $RUN examples/scale/capture.py --model zoo:smollm2-135m \
  --data "$DATA/wikitext-2/valid.txt" --blocks 0,1,14,29 --rotate --nsamples 16 --seqlen 256 --out "$WORK/smollm2"
for shape in 135M 360M 1.1B; do
  [ -f "runs/scale/$shape-2block/config.json" ] || $RUN - "$shape" <<'PYEOF'
import sys
from pathlib import Path
from toolkit.data.text import embedded_text
from toolkit.models.synthetic import llama_config, write_random_model
from toolkit.zoo.lm import train_tokenizer
shape = sys.argv[1]
write_random_model(Path(f"runs/scale/{shape}-2block"), llama_config(shape, 2), 0,
                   train_tokenizer(embedded_text()[:400_000], vocab_size=2000))
PYEOF
  [ -f "$WORK/$shape/index.json" ] || $RUN examples/scale/capture.py --model "runs/scale/$shape-2block" \
    --blocks 0,1 --fast --out "$WORK/$shape"
done
$RUN examples/scale/solvers_study.py --problems "$WORK/smollm2" --label "SmolLM2-135M"
$RUN examples/scale/solvers_study.py --problems "$WORK/135M" --label "135M shape"
$RUN examples/scale/solvers_study.py --problems "$WORK/360M" --label "360M shape" --blocks 1 --rows 512
$RUN examples/scale/solvers_study.py --problems "$WORK/1.1B" --label "1.1B shape" --blocks 1 --rows 256
$RUN examples/scale/gpu_plan.py
