#!/usr/bin/env bash
# TokUR repro on the toy arithmetic task: train a small character GPT-2 adder briefly in two stages (errors must
# remain), sample 4 answers per question, score each with 5 low-rank-perturbed copies (σ by the ≤1% rule on the
# answer NLL of 16 held-out anchor questions),
# report AUROC(uncertainty -> error) and best-of-N accuracies.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
OUT=runs/repro-tokur
QUESTIONS=${TOKUR_QUESTIONS:-60}
mkdir -p "$OUT"
if [ ! -f "$OUT/adder/config.json" ] || [ ! -f "$OUT/anchors.jsonl" ]; then
  $PY examples/tokur/toy.py --out "$OUT" --steps "${TOKUR_STEPS1:-300}" --questions "$QUESTIONS"
  rm -rf "$OUT/adder-stage1" && mv "$OUT/adder" "$OUT/adder-stage1"
  $PY examples/tokur/toy.py --out "$OUT" --steps "${TOKUR_STEPS2:-400}" --questions "$QUESTIONS" \
    --init "$OUT/adder-stage1"
fi
$PY -m cli.main -q uq tokur -m "$OUT/adder" -d "$OUT/toy.jsonl" --config examples/tokur/toy.yaml \
  --set anchor_data="$OUT/anchors.jsonl" --score "${TOKUR_SCORE:-epistemic}" -o "$OUT/run" --overwrite --json > "$OUT/run.json"
$PY - "$OUT" <<'PYEOF'
import json, sys
out = sys.argv[1]
metrics = json.load(open(f"{out}/run.json"))["metrics"]
rows = [{**row, "method": row["selection"]} for row in metrics["rows"]]  # gates.py looks rows up by "method"
results = {"auroc": metrics["auroc"], "auroc_by_score": metrics["auroc_by_score"], "sigma": metrics["sigma"],
           "n_questions": metrics["n_questions"], "rows": rows}
json.dump(results, open(f"{out}/results.json", "w"), indent=2)
print(f"sigma {metrics['sigma']:.4g}  AUROC(uncertainty -> error): " +
      "  ".join(f"{k} {v:.3f}" for k, v in metrics["auroc_by_score"].items()))
print(f"{'selection':<16} accuracy")
for row in metrics["rows"]:
    print(f"{row['selection']:<16} {row['accuracy']:.3f}")
PYEOF
