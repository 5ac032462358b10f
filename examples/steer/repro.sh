#!/usr/bin/env bash
# make repro-steer: PCMS vs UMS vs ILCS on the real SmolLM2-135M-Instruct (zoo:smollm2-135m, Q4_1-dequantized
# weights), category "violence"; writes runs/repro-steer/results.json and prints the table.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
OUT=runs/repro-steer
mkdir -p "$OUT"
$PY examples/steer/make_data.py examples/steer/data
$PY -m cli.main -q steer sweep -m zoo:smollm2-135m -d examples/steer/data/pairs.jsonl \
    --prompts examples/steer/data/prompts.jsonl --config examples/steer/config.yaml \
    -o "$OUT/sweep" --overwrite > /dev/null
$PY - "$OUT" <<'PYEOF'
import json, sys
out = sys.argv[1]
sweep = json.load(open(f"{out}/sweep/results.json"))
keys = ("method", "layer", "alpha", "operator", "category_prob_drop", "neutral_kl", "neutral_ppl_ratio",
        "split_half_cosine", "lexicon_drop", "lexicon_rate", "category_prob")
rows = [{k: r[k] for k in keys} for r in sweep["rows"]]
json.dump({"model": "zoo:smollm2-135m", "category": "violence", "baseline": sweep["baseline"], "rows": rows},
          open(f"{out}/results.json", "w"), indent=2)
print(f"unsteered: P(category)={sweep['baseline']['category_prob']:.3f} lexicon mass="
      f"{sweep['baseline']['lexicon_mass']:.4f} ppl={sweep['baseline']['ppl']:.2f}")
print(f"{'method':6} {'layer':>5} {'alpha':>5} {'P drop':>7} {'lex drop':>8} {'KL':>7} {'ppl x':>6} {'cos½':>6}")
for r in rows:
    print(f"{r['method']:6} {r['layer']:5d} {r['alpha']:5.2f} {r['category_prob_drop']:7.3f} {r['lexicon_drop']:8.3f} "
          f"{r['neutral_kl']:7.4f} {r['neutral_ppl_ratio']:6.3f} {r['split_half_cosine']:6.3f}")
PYEOF
