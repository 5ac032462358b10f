#!/usr/bin/env bash
# DeepRAG benchmark (make repro-deeprag): synthetic multi-hop KB with a tiny GPT-2 trained here, then a small
# honest run of the untrained zoo:smollm2-135m on HotpotQA and NQ. Writes runs/repro-deeprag/results.json.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-runs/repro-deeprag}
DATA=${DATA:-../shared/data}
REAL_LIMIT=${REAL_LIMIT:-32}
PARTS=${PARTS:-"kb real"}  # kb: synthetic-KB benchmark; real: smollm2-135m on HotpotQA + NQ
export OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
IK=(.venv/bin/python -m cli.main -q)
mkdir -p "$OUT"
start=$(date +%s)
stamp() { echo "[deeprag repro] $1 ($(( $(date +%s) - start ))s)" >&2; }

if [[ " $PARTS " == *" kb "* ]]; then
rm -rf "$OUT"/{setup,index,synth,trained,synth-*,cand,val-*,test-*,eval-kb,selection.json}

# SETUP_FROM=DIR reuses the base model of an earlier setup run (same seed and arguments) instead of pretraining again.
.venv/bin/python examples/deeprag/setup_kb.py --out "$OUT/setup" --epochs "${PRETRAIN_EPOCHS:-3}" \
  ${SETUP_FROM:+--base-from "$SETUP_FROM"} ${SETUP_ARGS:-} >/dev/null
stamp "base model trained on the known half of the facts"
"${IK[@]}" rag deeprag index --corpus "$OUT/setup/corpus.jsonl" -o "$OUT/index" >/dev/null
KB_RUN=(rag deeprag run --index "$OUT/index" --config examples/deeprag/kb.yaml --top-k 1 --set max_new_tokens=12
        --set batch_size=32 --set dataset_name=synthetic-kb)
# Candidates, trained on the train questions: search variant (the paper's | evidence-checked parametric answers) x
# {SFT only, SFT + DPO at each beta-lr setting, 8 epochs = the paper's count}. One process per search variant.
candidates() {
  local check=$1
  "${IK[@]}" rag deeprag synth -m "$OUT/setup/base" -d "$OUT/setup/train.jsonl" --index "$OUT/index" \
    --config examples/deeprag/kb.yaml --top-k 1 --set max_new_tokens=8 --set parametric_check="$check" \
    -o "$OUT/synth-$check" >/dev/null
  "${IK[@]}" rag deeprag train -m "$OUT/setup/base" -d "$OUT/synth-$check" --set stages=[sft] --set sft_lr=2e-3 \
    --set sft_epochs="${SFT_EPOCHS:-40}" --set batch_size=8 --set max_length=256 -o "$OUT/cand/$check-sft" >/dev/null
  for dpo in ${DPO_GRID:-b0.4-lr5e-6 b0.1-lr5e-5}; do
    local beta=${dpo%%-*} lr=${dpo##*-lr}
    "${IK[@]}" rag deeprag train -m "$OUT/cand/$check-sft/model" -d "$OUT/synth-$check" --set stages=[dpo] \
      --set dpo_beta="${beta#b}" --set dpo_lr="$lr" --set dpo_epochs=8 --set batch_size=8 --set max_length=256 \
      -o "$OUT/cand/$check-sft-dpo-$dpo" >/dev/null
  done
  for cand in "$OUT"/cand/"$check"-*/; do
    "${IK[@]}" "${KB_RUN[@]}" -m "$cand/model" -d "$OUT/setup/val.jsonl" --methods deeprag,always \
      -o "$OUT/val-$(basename "$cand")" >/dev/null
  done
}
pids=()
for check in ${CHECKS:-none evidence}; do candidates "$check" & pids+=($!); done
for pid in "${pids[@]}"; do wait "$pid"; done
chosen=$(.venv/bin/python examples/deeprag/select_config.py "$OUT")
stamp "candidates trained and validated; chose $chosen"
"${IK[@]}" "${KB_RUN[@]}" -m "$OUT/cand/$chosen/model" -d "$OUT/setup/test.jsonl" \
  --methods deeprag,always,never,single -o "$OUT/eval-kb" >/dev/null
for cand in "$OUT"/cand/*/; do  # every other candidate on test too, for the record (the choice is already made)
  name=$(basename "$cand")
  [[ "$name" == "$chosen" ]] && continue
  "${IK[@]}" "${KB_RUN[@]}" -m "$cand/model" -d "$OUT/setup/test.jsonl" --methods deeprag,always -o "$OUT/test-$name" >/dev/null
done
stamp "synthetic-KB evaluation"
fi

if [[ " $PARTS " == *" real "* ]]; then
rm -rf "$OUT"/{index-nq,eval-hotpotqa,eval-nq}

"${IK[@]}" rag deeprag run -m zoo:smollm2-135m -d "$DATA/hotpotqa/dev_subsampled.jsonl" --index contexts \
  --methods deeprag,always,never,single --config examples/deeprag/real.yaml --limit "$REAL_LIMIT" \
  --set dataset_name=hotpotqa -o "$OUT/eval-hotpotqa" >/dev/null
stamp "HotpotQA (smollm2-135m)"
"${IK[@]}" rag deeprag index --corpus "$DATA/flashrag-nq/sample_data.jsonl" -o "$OUT/index-nq" >/dev/null
"${IK[@]}" rag deeprag run -m zoo:smollm2-135m -d "$DATA/flashrag-nq/test.jsonl" --index "$OUT/index-nq" \
  --methods deeprag,always,never,single --config examples/deeprag/real.yaml --limit "$REAL_LIMIT" \
  --set dataset_name=nq -o "$OUT/eval-nq" >/dev/null
stamp "NQ (smollm2-135m)"
fi
.venv/bin/python examples/deeprag/collect.py "$OUT"
