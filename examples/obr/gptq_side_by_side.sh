#!/usr/bin/env bash
# Our GPTQ against llm-compressor's GPTQ on SmolLM2-135M, W4A16, side by side in one go (issue 32): per channel and
# group 128, rotated (ours) and unrotated, activation ordering on (static) and off; plus the two-stage
# SparseGPT 50% -> GPTQ rows (ours: `compress sparsegpt-gptq`; the peer: SparseGPTModifier -> GPTQModifier).
# Same token ids for both (32 x 512 calibration windows of WikiText-2 valid, seed 0), perplexity on 32 x 256 windows
# of test with toolkit.eval.perplexity, one thread each, runs one after the other (nice).
# Writes runs/repro-obr-gptq/<row>/run.json and runs/repro-obr-gptq/results.json; prints a Markdown table.
# ROWS picks rows (default: all, most important first); finished rows are reused (FRESH=1 recomputes).
#   row = WHO-rROTATE-gGROUP-ACTORDER, WHO in ours|peer (GPTQ) or ours2|peer2 (two-stage, 50% sparse), or
#   ours1 (our GPTQ with true_sequential=false: one calibration forward per block, as llm-compressor schedules it),
#   ours0 (our GPTQ with fused_calibration=never: a stopped forward per linear group, the schedule before fusing),
#   oursk (our GPTQ with rotation_kind=kron-orthogonal: H_p (x) random orthogonal instead of exact Hadamards),
#   obr (OBR_GPTQ W4A16 + 50% sparsity, against peer2)
# ROTATION_SEED (default 0) is passed to every rotated row of ours; OURS_SET adds flags to every row of ours (e.g.
# "--set w_clip_search=coarse"); use another OUT per seed or per OURS_SET.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-runs/repro-obr-gptq}
DATA=${DATA:-${ICLRKIT_DATA:-../shared/data}/wikitext-2}  # data root: $ICLRKIT_DATA, default ../shared/data
VALID=$DATA/valid.txt; TEST=$DATA/test.txt
MODEL=${MODEL:-zoo:smollm2-135m}
NSAMPLES=${NSAMPLES:-32}; SEQLEN=${SEQLEN:-512}; EVAL_WINDOWS=${EVAL_WINDOWS:-32}
THREADS=${THREADS:-1}
export OMP_NUM_THREADS=$THREADS MKL_NUM_THREADS=$THREADS
ROWS=${ROWS:-"ours-r0-gnone-static peer-r0-gnone-static ours-r1-gnone-static ours-r0-gnone-none peer-r0-gnone-none
ours-r1-gnone-none ours-r0-g128-static peer-r0-g128-static ours-r1-g128-static ours-r0-g128-none peer-r0-g128-none
ours-r1-g128-none ours2-r1-gnone-static peer2-r0-gnone-static ours2-r0-gnone-static"}
[ "${FRESH:-0}" = 1 ] && rm -rf "$OUT"
mkdir -p "$OUT"
CLI="nice -n 10 .venv/bin/iclrkit -q"

if [ ! -x .venv-bench/bin/python ]; then  # the [bench] extra: llmcompressor pins its own transformers
  python3 -m venv .venv-bench && .venv-bench/bin/pip install -q torch==2.13.0 llmcompressor 2>&1 | grep -v "is ignored" || true
fi
$CLI zoo build "${MODEL#zoo:}" > /dev/null
[ -f "$OUT/dense/run.json" ] || $CLI eval ppl --model "$MODEL" --data "$TEST" --max-length 256 \
  --max-windows "$EVAL_WINDOWS" --out "$OUT/dense" > /dev/null
TOKENS=$OUT/tokens.pt
if [ ! -f "$TOKENS" ]; then  # the peer gets our exact calibration windows and evaluation ids
  .venv/bin/python examples/obr/peer_tokens.py "$MODEL" "$VALID" "$TEST" "$NSAMPLES" "$SEQLEN" "$EVAL_WINDOWS" "$TOKENS"
fi
MODEL_DIR=$(.venv/bin/python -c "import torch; print(torch.load('$TOKENS')['model_dir'])")
COMMON="--model $MODEL --data $VALID --nsamples $NSAMPLES --seqlen $SEQLEN --eval-data $TEST
  --set eval_max_length=256 --set eval_windows=$EVAL_WINDOWS --w-bits 4 --a-bits 16 --kv-bits 16 --set export=none
  --set rotation_seed=${ROTATION_SEED:-0} ${OURS_SET:-}"

for row in $ROWS; do
  dir=$OUT/$row
  [ -f "$dir/run.json" ] && continue
  IFS=- read -r who rot group order <<< "$row"
  rot=${rot#r}; group=${group#g}
  rm -rf "$dir" "$dir.partial"
  echo "== $row ($(date -u +%H:%M:%S), load $(cut -d' ' -f1 /proc/loadavg))" >&2
  flags="--actorder $order"
  [ "$rot" = 1 ] && flags="$flags --rotate" || flags="$flags --no-rotate"
  [ "$group" != none ] && flags="$flags --group-size $group"
  case $who in
    ours) $CLI compress gptq $COMMON $flags --out "$dir" > /dev/null ;;
    oursk) $CLI compress gptq $COMMON $flags --set rotation_kind=kron-orthogonal --out "$dir" > /dev/null ;;
    ours1) $CLI compress gptq $COMMON $flags --set true_sequential=false --out "$dir" > /dev/null ;;
    ours0) $CLI compress gptq $COMMON $flags --set fused_calibration=never --out "$dir" > /dev/null ;;
    obr) $CLI compress obr $COMMON ${flags#--actorder $order } --sparsity 0.5 --out "$dir" > /dev/null ;;  # OBR: no actorder
    ours2) $CLI compress sparsegpt-gptq $COMMON $flags --sparsity 0.5 --out "$dir" > /dev/null ;;
    peer|peer2)
      [ "$rot" = 1 ] && { echo "peer rows are unrotated only: skipping $row" >&2; continue; }
      recipe=gptq; [ "$who" = peer2 ] && recipe=sparsegpt+gptq
      nice -n 10 .venv-bench/bin/python examples/obr/peer_llmcompressor.py "$MODEL_DIR" "$TOKENS" "$recipe" "$dir" \
        "$group" "$order" > "$OUT/$row.log" 2>&1 || { echo "peer row $row failed: see $OUT/$row.log" >&2; rm -rf "$dir"; } ;;
  esac
done

.venv/bin/python examples/obr/collect_gptq.py "$OUT" "$THREADS"
