#!/usr/bin/env bash
# DeepRAG benchmark (make repro-deeprag): synthetic multi-hop KB with a tiny GPT-2 trained here, then a small
# honest run of the untrained zoo:smollm2-135m on HotpotQA and NQ. Writes runs/repro-deeprag/results.json.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-runs/repro-deeprag}
DATA=${DATA:-../shared/data}
REAL_LIMIT=${REAL_LIMIT:-8}
PARTS=${PARTS:-"kb real"}  # kb: synthetic-KB benchmark; real: smollm2-135m on HotpotQA + NQ
export OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
IK=(.venv/bin/python -m cli.main -q)
mkdir -p "$OUT"
start=$(date +%s)
stamp() { echo "[deeprag repro] $1 ($(( $(date +%s) - start ))s)" >&2; }

if [[ " $PARTS " == *" kb "* ]]; then
rm -rf "$OUT"/{setup,index,synth,trained,eval-kb}

.venv/bin/python examples/deeprag/setup_kb.py --out "$OUT/setup" --epochs "${PRETRAIN_EPOCHS:-3}" ${SETUP_ARGS:-} >/dev/null
stamp "base model trained on the known half of the facts"
"${IK[@]}" rag deeprag index --corpus "$OUT/setup/corpus.jsonl" -o "$OUT/index" >/dev/null
"${IK[@]}" rag deeprag synth -m "$OUT/setup/base" -d "$OUT/setup/train.jsonl" --index "$OUT/index" \
  --config examples/deeprag/kb.yaml --top-k 1 --set max_new_tokens=8 -o "$OUT/synth" >/dev/null
stamp "tree-search synthesis"
"${IK[@]}" rag deeprag train -m "$OUT/setup/base" -d "$OUT/synth" --set sft_lr=2e-3 --set sft_epochs="${SFT_EPOCHS:-40}" \
  --set dpo_lr=5e-6 --set dpo_epochs="${DPO_EPOCHS:-8}" --set batch_size=8 --set max_length=256 -o "$OUT/trained" >/dev/null
stamp "SFT + DPO"
"${IK[@]}" rag deeprag run -m "$OUT/trained/model" -d "$OUT/setup/test.jsonl" --index "$OUT/index" \
  --methods deeprag,always,never,single --config examples/deeprag/kb.yaml --top-k 1 --set max_new_tokens=12 \
  --set batch_size=32 --set dataset_name=synthetic-kb -o "$OUT/eval-kb" >/dev/null
stamp "synthetic-KB evaluation"
fi

if [[ " $PARTS " == *" real "* ]]; then
rm -rf "$OUT"/{index-nq,eval-hotpotqa,eval-nq}

"${IK[@]}" rag deeprag run -m zoo:smollm2-135m -d "$DATA/hotpotqa/dev_subsampled.jsonl" --index contexts \
  --methods deeprag,always,never --config examples/deeprag/real.yaml --limit "$REAL_LIMIT" \
  --set dataset_name=hotpotqa -o "$OUT/eval-hotpotqa" >/dev/null
stamp "HotpotQA (smollm2-135m)"
"${IK[@]}" rag deeprag index --corpus "$DATA/flashrag-nq/sample_data.jsonl" -o "$OUT/index-nq" >/dev/null
"${IK[@]}" rag deeprag run -m zoo:smollm2-135m -d "$DATA/flashrag-nq/test.jsonl" --index "$OUT/index-nq" \
  --methods deeprag,always,never --config examples/deeprag/real.yaml --limit "$REAL_LIMIT" \
  --set dataset_name=nq -o "$OUT/eval-nq" >/dev/null
stamp "NQ (smollm2-135m)"
fi
.venv/bin/python examples/deeprag/collect.py "$OUT"
