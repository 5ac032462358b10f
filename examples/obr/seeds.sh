#!/usr/bin/env bash
# Issue 27 item 3: OBR against the two-stage SparseGPT -> GPTQ baseline over calibration seeds, SmolLM2-135M,
# the same rotation (QuaRot, exact Hadamards, rotation seed 0), grid and calibration for both; perplexity on the
# same 32 x 256 windows of WikiText-2 test. The seed draws the calibration windows (--seed).
#   SEEDS (default "0 1 2"), SETTINGS (default "w4a16-s50 w4a4kv4-s50 w4a4kv4-2:4"), METHODS (default
#   "obr-gptq sparsegpt-two-stage two-stage-unrotated": the two-stage baseline on the same rotation and unrotated,
#   its strongest form at W4A16 in the 32 x 512 run; "obr-unrotated" adds OBR without the rotation),
#   NSAMPLES x SEQLEN (default 16 x 256: what the CPU allows for the 27 runs of the defaults)
# Writes runs/repro-obr-seeds/<setting>/<method>-s<seed>/run.json (finished runs are reused), then
# examples/obr/seeds_table.py prints mean +- sd per (setting, method) and writes runs/repro-obr-seeds/results.json.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-runs/repro-obr-seeds}
DATA=${DATA:-${ICLRKIT_DATA:-../shared/data}/wikitext-2}
VALID=$DATA/valid.txt; TEST=$DATA/test.txt
MODEL=${MODEL:-zoo:smollm2-135m}
SEEDS=${SEEDS:-"0 1 2"}
SETTINGS=${SETTINGS:-"w4a16-s50 w4a4kv4-s50 w4a4kv4-2:4"}
METHODS=${METHODS:-"obr-gptq sparsegpt-two-stage two-stage-unrotated"}
NSAMPLES=${NSAMPLES:-16}; SEQLEN=${SEQLEN:-256}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
CLI="nice -n ${NICE:-5} .venv/bin/iclrkit -q"
mkdir -p "$OUT"
$CLI zoo build "${MODEL#zoo:}" > /dev/null
[ -f "$OUT/dense/run.json" ] || $CLI eval ppl --model "$MODEL" --data "$TEST" --max-length 256 --max-windows 32 \
  --out "$OUT/dense" > /dev/null
COMMON="--model $MODEL --data $VALID --nsamples $NSAMPLES --seqlen $SEQLEN --eval-data $TEST
  --set eval_max_length=256 --set eval_windows=32 --set export=none"
for setting in $SETTINGS; do
  case $setting in
    w4a16-s50) Q="--w-bits 4 --a-bits 16 --kv-bits 16"; S="--sparsity 0.5" ;;
    w4a4kv4-s50) Q="--w-bits 4 --a-bits 4 --kv-bits 4"; S="--sparsity 0.5" ;;
    w4a4kv4-2:4) Q="--w-bits 4 --a-bits 4 --kv-bits 4"; S="--nm 2:4" ;;
    *) echo "unknown setting $setting" >&2; exit 2 ;;
  esac
  for seed in $SEEDS; do
    for method in $METHODS; do
      dir=$OUT/${setting/:/-}/$method-s$seed
      [ -f "$dir/run.json" ] && continue
      rm -rf "$dir" "$dir.partial"
      echo "== $dir ($(date -u +%H:%M:%S), load $(cut -d' ' -f1 /proc/loadavg))" >&2
      case $method in
        obr-gptq) $CLI compress obr $COMMON $Q $S --mode gptq --seed "$seed" --out "$dir" > /dev/null ;;
        obr-unrotated) $CLI compress obr $COMMON $Q $S --mode gptq --no-rotate --seed "$seed" --out "$dir" \
          > /dev/null ;;
        sparsegpt-two-stage) $CLI compress sparsegpt-gptq $COMMON $Q $S --seed "$seed" --out "$dir" > /dev/null ;;
        two-stage-unrotated) $CLI compress sparsegpt-gptq $COMMON $Q $S --no-rotate --seed "$seed" --out "$dir" \
          > /dev/null ;;
        wanda-rtn) $CLI compress wanda $COMMON $Q $S --seed "$seed" --out "$dir" > /dev/null ;;
        *) echo "unknown method $method" >&2; exit 2 ;;
      esac
    done
  done
done
.venv/bin/python examples/obr/seeds_table.py "$OUT"
