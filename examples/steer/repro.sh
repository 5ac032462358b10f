#!/usr/bin/env bash
# make repro-steer: PCMS vs UMS vs ILCS on the real SmolLM2-135M-Instruct (zoo:smollm2-135m, Q4_1-dequantized
# weights), category "violence"; writes runs/repro-steer/results.json and prints the table.
# Three sweeps: config.yaml (single layer, 3 estimators), config-multilayer.yaml (PCMS at several layers at once),
# config-clip.yaml (PCMS with the clip operator, an option beyond the paper), all scored on prompts.jsonl (the prompts
# the settings were chosen on); then config-heldout*.yaml score the chosen settings on prompts_heldout.jsonl.
# Rows are concatenated; `eval_prompts` says which prompt set scored each row.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
OUT=runs/repro-steer
mkdir -p "$OUT"
$PY examples/steer/make_data.py examples/steer/data
for name in config config-multilayer config-clip config-heldout config-heldout-add; do
  case $name in config-heldout*) prompts=prompts_heldout.jsonl ;; *) prompts=prompts.jsonl ;; esac
  OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} $PY -m cli.main -q steer sweep -m zoo:smollm2-135m \
      -d examples/steer/data/pairs.jsonl --prompts "examples/steer/data/$prompts" \
      --config "examples/steer/$name.yaml" -o "$OUT/sweep-$name" --overwrite > /dev/null
done
$PY - "$OUT" <<'PYEOF'
import json, sys
out = sys.argv[1]
names = ("config", "config-multilayer", "config-clip", "config-heldout", "config-heldout-add")
sweeps = {name: json.load(open(f"{out}/sweep-{name}/results.json")) for name in names}
keys = ("method", "layer", "alpha", "operator", "category_prob_drop", "neutral_kl", "neutral_ppl_ratio",
        "split_half_cosine", "lexicon_drop", "lexicon_rate", "category_prob")
rows = [{**{k: r[k] for k in keys}, "eval_prompts": "heldout" if name.startswith("config-heldout") else "selection"}
        for name, sweep in sweeps.items() for r in sweep["rows"]]
base = sweeps["config"]["baseline"]
json.dump({"model": "zoo:smollm2-135m", "category": "violence", "baseline": base,
           "baseline_heldout": sweeps["config-heldout"]["baseline"], "rows": rows},
          open(f"{out}/results.json", "w"), indent=2)
print(f"unsteered: P(category)={base['category_prob']:.3f} lexicon mass={base['lexicon_mass']:.4f} ppl={base['ppl']:.2f}")
print(f"{'prompts':9} {'method':6} {'layer':>8} {'op':>6} {'alpha':>5} {'P drop':>7} {'lex drop':>8} {'KL':>7} {'ppl x':>6} {'cos½':>6}")
for r in rows:
    print(f"{r['eval_prompts']:9} {r['method']:6} {str(r['layer']):>8} {r['operator']:>6} {r['alpha']:5.2f} {r['category_prob_drop']:7.3f} "
          f"{r['lexicon_drop']:8.3f} {r['neutral_kl']:7.4f} {r['neutral_ppl_ratio']:6.3f} {r['split_half_cosine']:6.3f}")
PYEOF
