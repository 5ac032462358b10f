#!/usr/bin/env bash
# MHLP repro: (1) exact TV check with a scripted proposer + a scripted calibration table (seconds);
# (2) unless MHLP_LLM=0, the issue's ECE check: MHLP on SST-2 with zoo:smollm2-135m (chat template; evaluation by
# class-word scoring and the Bayesian model average over the posterior samples), whose rows
# become the "mhlp"/"single" rows of results.json (the synthetic rows are kept as "*-synthetic").
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
OUT=runs/repro-mhlp
$PY examples/mhlp/repro.py --out "$OUT" "$@"
if [ "${MHLP_LLM:-1}" != "0" ]; then
  $PY examples/mhlp/sst2.py --out "$OUT/sst2.jsonl" --per-class 53
  # one thread: on the shared 2-core machine two OpenMP threads per process were ~5x slower (they wait on each other)
  OMP_NUM_THREADS=1 $PY -m cli.main -q prompt mhlp --task-model zoo:smollm2-135m --proposer-model zoo:smollm2-135m \
    --config examples/mhlp/smollm2.yaml -d "$OUT/sst2.jsonl" \
    -o "$OUT/smollm2" --overwrite --json > "$OUT/smollm2.json"
  $PY - "$OUT" <<'PYEOF'
import json, sys
out = sys.argv[1]
results = json.load(open(f"{out}/results.json"))
metrics = json.load(open(f"{out}/smollm2.json"))["metrics"]
synthetic = [{**row, "method": row["method"] + "-synthetic"} for row in results["rows"]]
llm = [{**row, "task": f"sst2 ({metrics['n_eval']} eval), zoo:smollm2-135m, chat, class-word scoring"}
       for row in metrics["rows"]]
results.update(rows=llm + synthetic, smollm2={k: metrics[k] for k in ("n_samples", "acceptance_rate", "n_train",
                                                                        "n_eval")})
json.dump(results, open(f"{out}/results.json", "w"), indent=2)
print(f"smollm2 chain: {metrics['n_samples']} samples, acceptance {metrics['acceptance_rate']:.2f}")
print(f"{'method':<18} {'accuracy':>8} {'ece':>7} {'brier':>7} {'format':>7}")
for row in results["rows"]:
    print(f"{row['method']:<18} {row['accuracy']:8.3f} {row['ece']:7.3f} {row['brier']:7.3f} "
          f"{row.get('format_rate', float('nan')):7.2f}")
PYEOF
fi
