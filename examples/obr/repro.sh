#!/usr/bin/env bash
# OBR vs baselines at W4A4KV4 (QuaRot rotation, fake-quant activations/KV on CPU), one shared recipe per model.
# Writes runs/repro-obr/results.json {"rows":[{model, setting, method, ppl, size_mb, seconds}]} and prints a table.
# Finished runs are reused (delete runs/repro-obr or set FRESH=1 to recompute). MODELS="llama-small smollm2-135m".
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
      $CLI zoo build llama-small --data "$VALID" > /dev/null
      key=$(.venv/bin/python -c "from toolkit.zoo.registry import data_key; print(data_key('$VALID'))")
      MODEL="zoo:llama-small@$key"; CAL="--nsamples 32 --seqlen 256"; EVAL_WINDOWS=64
      SETTINGS="w4a4kv4-s50 w4a4kv4-2:4" ;;
    smollm2-135m)
      MODEL="zoo:smollm2-135m"; CAL="--nsamples 16 --seqlen 256"; EVAL_WINDOWS=32
      SETTINGS="w4a4kv4-s50" ;;
  esac
  EVAL="--eval-data $TEST --set eval_max_length=256 --set eval_windows=$EVAL_WINDOWS"
  COMMON="--model $MODEL --data $VALID $CAL $EVAL --set export=packed"
  run "$OUT/$name/dense" $CLI eval ppl --model "$MODEL" --data "$TEST" --max-length 256 --max-windows "$EVAL_WINDOWS"
  for setting in $SETTINGS; do
    case $setting in
      w4a4kv4-s50) Q="--w-bits 4 --a-bits 4 --kv-bits 4"; S="--sparsity 0.5" ;;
      w4a4kv4-2:4) Q="--w-bits 4 --a-bits 4 --kv-bits 4"; S="--nm 2:4" ;;
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
