#!/usr/bin/env bash
# make repro-backdoor: BadNets ('cf', 10% poison, target 1) on an SST-2 subset -> MiniLM classifier; X-GRAAD vs
# STRIP and ONION on the GLUE SST-2 dev set; threshold from held-out clean TRAIN sentences (never the test split).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
OUT=runs/repro-backdoor
DATA=../shared/data/sst2
mkdir -p "$OUT"
if [ ! -f "$OUT/victim/model/config.json" ]; then
  OMP_NUM_THREADS=1 $PY -m cli.main -q defend attack -d "$DATA/train.tsv" --eval-data "$DATA/dev.tsv" --config examples/backdoor/attack.yaml \
      -o "$OUT/victim" --overwrite > /dev/null
fi
OMP_NUM_THREADS=1 $PY -m cli.main -q defend backdoor -m "$OUT/victim/model" -d "$DATA/dev.tsv" --clean "$OUT/victim/heldout.tsv" \
    --config examples/backdoor/defend.yaml -o "$OUT/eval" --overwrite > /dev/null
$PY - "$OUT" <<'PYEOF'
import json, sys
out = sys.argv[1]
r = json.load(open(f"{out}/eval/results.json"))
keys = ("asr_before", "asr_after", "asr_strip", "asr_onion", "cacc_before", "cacc_after", "trigger_top1_rate")
extra = ("clean_over_threshold_rate", "clean_flag_rate", "poison_detect_rate", "n_clean", "n_poisoned", "threshold")
victim = json.load(open(f"{out}/victim/run.json"))
result = {**{k: r[k] for k in keys}, **{k: r[k] for k in extra},
          "strip": r["baselines"]["strip"], "onion": r["baselines"]["onion"], "victim": victim["metrics"],
          "victim_config": victim["config"]}
json.dump(result, open(f"{out}/results.json", "w"), indent=2)
for k in keys + extra:
    print(f"{k:28} {r[k]:.4f}" if isinstance(r[k], float) else f"{k:28} {r[k]}")
print(f"{'strip clean flag rate':28} {r['baselines']['strip']['clean_flag_rate']:.4f}")
print(f"{'onion clean acc (subset)':28} {r['baselines']['onion']['cacc_subset']:.4f} (n={r['baselines']['onion']['cacc_subset_n']})")
PYEOF
