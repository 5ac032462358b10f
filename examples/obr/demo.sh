#!/usr/bin/env bash
# A <10-minute CPU demo of `iclrkit compress obr`: zoo:llama-small (built on first use, ~3 min) → W4A4KV4 + 50%
# unstructured sparsity with QuaRot rotation → table of dense / RTN / SparseGPT+GPTQ / OBR_GPTQ (perplexity on a
# held-out split of the embedded text, packed size, compression time). Activations and KV are fake-quantized on CPU.
# Every step says what it does; the commands' own progress lines (zoo training steps, blocks) go to stderr.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=runs/demo-obr
rm -rf "$OUT" && mkdir -p "$OUT"
CLI=".venv/bin/iclrkit"
START=$(date +%s)
step() { echo "[demo $(( $(date +%s) - START ))s] $*" >&2; }
# On a CPU shared with other jobs, OMP_NUM_THREADS=1 is much faster; on an idle machine all cores are (1.7x on 2).
MODEL=${DEMO_MODEL:-zoo:llama-small}  # DEMO_MODEL=zoo:NAME or a path runs the demo on another Llama-family model
if [ -z "${DEMO_MODEL:-}" ]; then
  step "1/6 zoo:llama-small: a 4-layer Llama trained on the embedded text (built on first use, ~3 min; cached after)"
  $CLI zoo build llama-small > /dev/null
fi
step "2/6 calibration text and a held-out 5% split"
.venv/bin/python - <<'PY'
from toolkit.data.text import embedded_text, split_text
train, test = split_text(embedded_text(), test_fraction=0.05, seed=0)  # the zoo's own held-out split
open("runs/demo-obr/calib.txt", "w").write(train)
open("runs/demo-obr/heldout.txt", "w").write(test)
PY
COMMON="--model $MODEL --data $OUT/calib.txt --nsamples 16 --seqlen 128 --eval-data $OUT/heldout.txt
        --set eval_max_length=256 --set eval_windows=24 --set export=packed --w-bits 4 --a-bits 4 --kv-bits 4
        --sparsity 0.5"
DIR=$OUT/llama-small/w4a4kv4-s50
step "3/6 dense perplexity"
$CLI eval ppl --model $MODEL --data $OUT/heldout.txt --max-length 256 --max-windows 24 --out $OUT/llama-small/dense > /dev/null
step "4/6 baseline: RTN + magnitude pruning (W4A4KV4, 50% sparse)"
$CLI compress rtn $COMMON --out $DIR/rtn-magnitude > /dev/null
step "5/6 baseline: SparseGPT + GPTQ (same setting)"
$CLI compress sparsegpt $COMMON --out $DIR/sparsegpt-gptq > /dev/null
step "6/6 OBR_GPTQ (same setting)"
$CLI compress obr $COMMON --out $DIR/obr-gptq > /dev/null
.venv/bin/python examples/obr/collect.py "$OUT"
step "done"
cat <<EOF

What to try next:
  # evaluate the packed OBR model (any command takes a packed/ directory as --model)
  $CLI eval ppl --model $DIR/obr-gptq/packed --data $OUT/heldout.txt --max-length 256 --max-windows 24
  # load it in Python
  .venv/bin/python -c "from toolkit.compress.packed import load_packed; print(load_packed('$DIR/obr-gptq/packed'))"
  # a weight-only model for the engines: compress W4A16, then export it
  $CLI compress obr --model $MODEL --data $OUT/calib.txt --w-bits 4 --a-bits 16 --kv-bits 16 --sparsity 0.5 \\
      --nsamples 16 --seqlen 128 --set export=packed --out $OUT/obr-w4a16
  $CLI export compressed-tensors $OUT/obr-w4a16 --out $OUT/obr-w4a16-ct   # transformers from_pretrained / vllm serve
  $CLI export gguf $OUT/obr-w4a16 --out $OUT/obr-w4a16-gguf               # llama.cpp
  # your own model: DEMO_MODEL=/path/to/llama bash examples/obr/demo.sh, or see examples/obr/README.md
EOF
