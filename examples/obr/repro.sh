#!/usr/bin/env bash
# OBR vs baselines at W4A4KV4 (QuaRot rotation, fake-quant activations/KV on CPU), one shared recipe per model.
# Writes runs/repro-obr/results.json {"rows":[{model, setting, method, ppl, size_mb, seconds}]} and prints a table.
# Finished runs are reused (delete runs/repro-obr or set FRESH=1 to recompute). MODELS="llama-small gpt2-small smollm2-135m".
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=runs/repro-obr
DATA=${DATA:-../shared/data/wikitext-2}
[ -d "$DATA" ] || DATA=/work/shared/data/wikitext-2
VALID=$DATA/valid.txt; TEST=$DATA/test.txt
MODELS=${MODELS:-"llama-small smollm2-135m"}
[ "${FRESH:-0}" = 1 ] && rm -rf "$OUT"
mkdir -p "$OUT"
CLI=".venv/bin/iclrkit -q"
# On a shared CPU one thread is much faster for GPTQ/SparseGPT column loops (no OpenMP spin under contention).
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

run() {  # run DIR COMMAND...: skip when DIR/run.json exists
  local dir=$1; shift
  if [ -f "$dir/run.json" ]; then return; fi
  rm -rf "$dir" "$dir.partial"
  echo "== $dir" >&2
  "$@" --out "$dir" > /dev/null
}

for name in $MODELS; do
  case $name in
    llama-small)
      # LLAMA_STEPS overrides the recipe's 400 training steps (a shared, overloaded CPU cannot train 400 in time)
      STEPS=${LLAMA_STEPS:+--steps $LLAMA_STEPS}
      $CLI zoo build llama-small --data "$VALID" $STEPS > /dev/null
      key=$(.venv/bin/python -c "from toolkit.zoo.registry import variant_key; print(variant_key('$VALID', ${LLAMA_STEPS:-None}))")
      MODEL="zoo:llama-small@$key"; CAL="--nsamples 32 --seqlen 256"; EVAL_WINDOWS=64
      SETTINGS="w4a4kv4-s50 w4a4kv4-2:4" ;;
    gpt2-small)  # LayerNorm: no rotation; the zoo recipe's own text, held-out 5% split for evaluation
      MODEL="zoo:gpt2-small"; CAL="--nsamples 32 --seqlen 256"; EVAL_WINDOWS=64
      .venv/bin/python -c "
from toolkit.data.text import embedded_text, split_text
train, test = split_text(embedded_text(), test_fraction=0.05, seed=0)
open('$OUT/embedded-train.txt', 'w').write(train); open('$OUT/embedded-heldout.txt', 'w').write(test)"
      SETTINGS="w4a16-s50 w4a4kv4-s50" ;;
    smollm2-135m)
      MODEL="zoo:smollm2-135m"; CAL="--nsamples 16 --seqlen 256"; EVAL_WINDOWS=32
      SETTINGS="w4a4kv4-s50" ;;
  esac
  CALIB=$VALID; HELDOUT=$TEST
  [ "$name" = gpt2-small ] && CALIB=$OUT/embedded-train.txt && HELDOUT=$OUT/embedded-heldout.txt
  EVAL="--eval-data $HELDOUT --set eval_max_length=256 --set eval_windows=$EVAL_WINDOWS"
  COMMON="--model $MODEL --data $CALIB $CAL $EVAL --set export=packed"
  run "$OUT/$name/dense" $CLI eval ppl --model "$MODEL" --data "$HELDOUT" --max-length 256 --max-windows "$EVAL_WINDOWS"
  [ -f "$OUT/$name/w4a16/nf4-bnb/run.json" ] || .venv/bin/python examples/obr/nf4.py "$MODEL" "$HELDOUT" 256 \
    "$EVAL_WINDOWS" "$OUT/$name/w4a16/nf4-bnb" 2> /dev/null
  for setting in $SETTINGS; do
    case $setting in
      w4a4kv4-s50) Q="--w-bits 4 --a-bits 4 --kv-bits 4"; S="--sparsity 0.5" ;;
      w4a4kv4-2:4) Q="--w-bits 4 --a-bits 4 --kv-bits 4"; S="--nm 2:4" ;;
      w4a16-s50) Q="--w-bits 4 --a-bits 16 --kv-bits 16"; S="--sparsity 0.5" ;;
    esac
    dir="$OUT/$name/${setting/:/-}"
    run "$dir/rtn-magnitude" $CLI compress rtn $COMMON $Q $S
    run "$dir/wanda-rtn" $CLI compress wanda $COMMON $Q $S
    run "$dir/sparsegpt-gptq" $CLI compress sparsegpt $COMMON $Q $S
    run "$dir/obr-rtn" $CLI compress obr $COMMON $Q $S --mode rtn
    run "$dir/obr-gptq" $CLI compress obr $COMMON $Q $S --mode gptq
  done
done

.venv/bin/python examples/obr/collect.py "$OUT"
