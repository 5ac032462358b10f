#!/usr/bin/env bash
# A <10-minute CPU demo of `iclrkit compress obr`: zoo:llama-small (built on first use, ~3 min) → W4A4KV4 + 50%
# unstructured sparsity with QuaRot rotation → table of dense / RTN / SparseGPT+GPTQ / OBR_GPTQ (perplexity on a
# held-out split of the embedded text, packed size, compression time). Activations and KV are fake-quantized on CPU.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=runs/demo-obr
rm -rf "$OUT" && mkdir -p "$OUT"
CLI=".venv/bin/iclrkit -q"
# On a CPU shared with other jobs, OMP_NUM_THREADS=1 is much faster; on an idle machine all cores are (1.7x on 2).
MODEL=${DEMO_MODEL:-zoo:llama-small}  # DEMO_MODEL=zoo:NAME or a path runs the demo on another Llama-family model
[ -n "${DEMO_MODEL:-}" ] || $CLI zoo build llama-small > /dev/null
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
$CLI eval ppl --model $MODEL --data $OUT/heldout.txt --max-length 256 --max-windows 24 --out $OUT/llama-small/dense > /dev/null
$CLI compress rtn $COMMON --out $DIR/rtn-magnitude > /dev/null
$CLI compress sparsegpt $COMMON --out $DIR/sparsegpt-gptq > /dev/null
$CLI compress obr $COMMON --out $DIR/obr-gptq > /dev/null
.venv/bin/python examples/obr/collect.py "$OUT"
echo "packed OBR model: $DIR/obr-gptq/packed (load with toolkit.compress.packed.load_packed)"
