#!/usr/bin/env bash
# make repro-backdoor: BadNets ('cf', 10% poison, target 1) on 12,000 SST-2 train sentences -> MiniLM classifier (~30 min on one core); X-GRAAD vs
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
# ablation: received attention summed over the real tokens' rows only (no padding rows), no baselines
OMP_NUM_THREADS=1 $PY -m cli.main -q defend backdoor -m "$OUT/victim/model" -d "$DATA/dev.tsv" --clean "$OUT/victim/heldout.tsv" \
    --config examples/backdoor/defend.yaml --set attention_rows=real --set 'baselines=[]' -o "$OUT/eval-real-rows" \
    --overwrite > /dev/null
$PY - "$OUT" <<'PYEOF'
import json, sys
out = sys.argv[1]
r = json.load(open(f"{out}/eval/results.json"))
keys = ("asr_before", "asr_after", "asr_strip", "asr_onion", "cacc_before", "cacc_after", "trigger_top1_rate")
extra = ("clean_over_threshold_rate", "clean_flag_rate", "poison_detect_rate", "n_clean", "n_poisoned", "threshold")
real = json.load(open(f"{out}/eval-real-rows/results.json"))
victim = json.load(open(f"{out}/victim/run.json"))
pad_to = json.load(open(f"{out}/eval/run.json"))["metrics"]["pad_to"]
result = {**{k: r[k] for k in keys}, **{k: r[k] for k in extra}, "pad_to": pad_to,
          "strip": r["baselines"]["strip"], "onion": r["baselines"]["onion"],
          "ablation_real_rows": {k: real[k] for k in keys + extra if k in real},
          "victim": victim["metrics"], "victim_config": victim["config"]}
json.dump(result, open(f"{out}/results.json", "w"), indent=2)
print(f"{'metric':28} {'padded rows':>12} {'real rows':>12}")
for k in keys + extra:
    cell = lambda d: "-" if k not in d else f"{d[k]:.4f}" if isinstance(d[k], float) else str(d[k])  # noqa: E731
    print(f"{k:28} {cell(r):>12} {cell(real):>12}")
print(f"{'pad_to':28} {pad_to:>12}")
print(f"{'strip clean flag rate':28} {r['baselines']['strip']['clean_flag_rate']:.4f}")
print(f"{'onion clean acc (subset)':28} {r['baselines']['onion']['cacc_subset']:.4f} (n={r['baselines']['onion']['cacc_subset_n']})")
PYEOF
