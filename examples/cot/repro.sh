#!/usr/bin/env bash
# CoT vs no-CoT on the synthetic two-hop KB (about 30 minutes on 2 shared CPU cores).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=runs/repro-cot
rm -rf "$OUT" "$OUT.partial"
.venv/bin/iclrkit -v study cot --config examples/cot/config.yaml --out "$OUT" > /dev/null
.venv/bin/python - <<'PY'
import json
m = json.load(open("runs/repro-cot/run.json"))["metrics"]
results = {"ood_acc_cot": m["cot"]["ood_acc"], "ood_acc_nocot": m["nocot"]["ood_acc"],
           "id_acc_cot": m["cot"]["id_acc"], "id_acc_nocot": m["nocot"]["id_acc"],
           "bridge_layer_cot": m["cot"]["bridge_layer"], "bridge_layer_nocot": m["nocot"]["bridge_layer"],
           "id_atomic_cot": m["cot"]["id_atomic"], "id_atomic_nocot": m["nocot"]["id_atomic"],
           "ood_atomic_cot": m["cot"]["ood_atomic"], "ood_atomic_nocot": m["nocot"]["ood_atomic"],
           "data": m["data"]}
json.dump(results, open("runs/repro-cot/results.json", "w"), indent=2)
print(f"{'model':6} {'ID 2-hop':>9} {'OOD 2-hop':>10} {'ID atomic':>10} {'bridge layer':>13}")
for mode in ("cot", "nocot"):
    print(f"{mode:6} {results['id_acc_' + mode]:9.3f} {results['ood_acc_' + mode]:10.3f} "
          f"{results['id_atomic_' + mode]:10.3f} {results['bridge_layer_' + mode]:13d}")
PY
