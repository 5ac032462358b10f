#!/usr/bin/env bash
# LN removal vs vanilla fine-tuning on zoo:gpt2-small (WikiText-2 valid), CE on WikiText-2 test.
# Writes runs/repro-remove-ln/results.json and prints a table. SCALING=1 adds the 2/4/6-layer token sweep (hours on 2 shared cores).
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"  # 2 shared cores: one thread is far faster under contention
ICLRKIT=.venv/bin/iclrkit
PY=.venv/bin/python
DATA="${DATA:-../shared/data/wikitext-2}"
OUT=runs/repro-remove-ln
BATCH=16
SEQLEN=128
mkdir -p "$OUT"

model_spec() {  # zoo build prints {"model": "zoo:NAME@sha", ...}
  "$@" --json | "$PY" -c 'import json, sys; print(json.load(sys.stdin)["model"])'
}
budget_steps() {  # steps for FRACTION of the zoo model's own training tokens at BATCH x SEQLEN
  "$PY" - "$1" "$2" <<'PY'
import json, sys
from toolkit.models.source import resolve_model_path
meta = json.loads((resolve_model_path(sys.argv[1]) / "config.json").read_text())["iclrkit"]
print(int(meta["train_tokens"] * float(sys.argv[2]) // (16 * 128)))
PY
}

MODEL=$(model_spec "$ICLRKIT" zoo build gpt2-small --data "$DATA/valid.txt")
STEPS=$(budget_steps "$MODEL" 0.25)
echo "model $MODEL: LN removal and vanilla fine-tune, $STEPS steps x $BATCH x $SEQLEN tokens" >&2
"$ICLRKIT" remove-ln run -m "$MODEL" -d "$DATA/valid.txt" --eval-data "$DATA/test.txt" --steps "$STEPS" \
  --batch-size $BATCH --seqlen $SEQLEN --vanilla-control --export both --set eval_windows=400 \
  -o "$OUT/main" --overwrite --json > "$OUT/main.json"
"$ICLRKIT" remove-ln analyze -m "$OUT/main/model" -d "$DATA/test.txt" --reference "$MODEL" --seqlen $SEQLEN \
  --windows 32 --set eval_windows=400 --json > "$OUT/analyze_plain.json"
"$ICLRKIT" remove-ln analyze -m "$OUT/main/model-folded" -d "$DATA/test.txt" --seqlen $SEQLEN \
  --windows 32 --set eval_windows=400 --json > "$OUT/analyze_folded.json"

if [ "${SCALING:-0}" = "1" ]; then
  # Token need vs depth: same steps (room for every LN of a 6-layer model), growing batch; LN removal only, compared
  # with each model's own original CE. Each depth gets its own zoo dir under OUT (kept apart from the user cache).
  mkdir -p "$OUT/scaling"
  for LAYERS in ${SCALING_LAYERS:-2 4 6}; do
    if [ "$LAYERS" = 4 ]; then SPEC=$MODEL; ZOO=${ICLRKIT_ZOO_DIR:-$HOME/.cache/iclrkit/zoo}; else
      ZOO="$OUT/zoo-L$LAYERS"
      SPEC=$(ICLRKIT_ZOO_DIR="$ZOO" model_spec "$ICLRKIT" zoo build gpt2-small --data "$DATA/valid.txt" --layers $LAYERS)
    fi
    for B in ${SCALING_BATCHES:-2 4 8}; do
      echo "scaling: $LAYERS layers, 80 steps x $B x $SEQLEN" >&2
      ICLRKIT_ZOO_DIR="$ZOO" "$ICLRKIT" remove-ln run -m "$SPEC" -d "$DATA/valid.txt" --eval-data "$DATA/test.txt" \
        --steps 80 --batch-size "$B" --seqlen $SEQLEN --set eval_windows=100 -o "$OUT/scaling/L$LAYERS-b$B" \
        --overwrite --json > "$OUT/scaling/L$LAYERS-b$B.json" || echo "scaling run L$LAYERS b$B failed" >&2
    done
  done
fi

"$PY" examples/remove-ln/summarize.py "$OUT"
