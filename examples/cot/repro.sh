#!/usr/bin/env bash
# CoT vs no-CoT on the synthetic two-hop KB: the two models train in parallel, one CPU thread each
# (about 30 minutes on 2 otherwise idle cores; much longer when the machine is shared).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=runs/repro-cot
rm -rf "$OUT" "$OUT".partial "$OUT"/../repro-cot-*.partial && mkdir -p "$OUT"
for mode in cot nocot; do
  .venv/bin/iclrkit -v study cot --config examples/cot/config.yaml --modes $mode --out "$OUT/$mode" \
    > /dev/null 2> "$OUT/$mode.log" &
done
wait
.venv/bin/python - <<'PY'
import json
from toolkit.study.cot import first_resolved_layer
m = {mode: json.load(open(f"runs/repro-cot/{mode}/run.json"))["metrics"] for mode in ("cot", "nocot")}
ranks = {mode: json.load(open(f"runs/repro-cot/{mode}/history.json"))[mode]["ranks_iid"] for mode in ("cot", "nocot")}
results = {"ood_acc_cot": m["cot"]["cot"]["ood_acc"], "ood_acc_nocot": m["nocot"]["nocot"]["ood_acc"],
           "id_acc_cot": m["cot"]["cot"]["id_acc"], "id_acc_nocot": m["nocot"]["nocot"]["id_acc"],
           # bridge layer at the r2 (answer) position, recomputed from the saved per-layer ranks
           "bridge_layer_cot": first_resolved_layer(ranks["cot"], "r2"),
           "bridge_layer_nocot": first_resolved_layer(ranks["nocot"], "r2")}
extra = {f"{key}_{mode}": m[mode][mode][key] for mode in ("cot", "nocot")
         for key in ("id_atomic", "ood_atomic", "train_inferred")}
extra.update({f"bridge_layer_r1_{mode}": first_resolved_layer(ranks[mode], "r1") for mode in ranks})
json.dump({**results, **extra, "data": m["cot"]["data"]}, open("runs/repro-cot/results.json", "w"), indent=2)
print(f"{'model':6} {'ID 2-hop':>9} {'OOD 2-hop':>10} {'ID atomic':>10} {'bridge layer':>13}")
for mode in ("cot", "nocot"):
    print(f"{mode:6} {results['id_acc_' + mode]:9.3f} {results['ood_acc_' + mode]:10.3f} "
          f"{extra['id_atomic_' + mode]:10.3f} {results['bridge_layer_' + mode]:13d}")
PY
