#!/usr/bin/env bash
# Benign-overfitting grid vs the reference curve; logistic-loss and Student-t variants beside it (a few minutes).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=runs/repro-benign-overfit
rm -rf "$OUT" && mkdir -p "$OUT"
CFG=examples/benign-overfit/config.yaml
.venv/bin/iclrkit study benign-overfit --config "$CFG" --out "$OUT/exponential" > /dev/null
.venv/bin/iclrkit study benign-overfit --config "$CFG" --loss logistic --out "$OUT/logistic" > /dev/null
.venv/bin/iclrkit study benign-overfit --config "$CFG" --set noise=student_t --set dof=5 --out "$OUT/student_t" > /dev/null
.venv/bin/python - <<'PY'
import json
out = "runs/repro-benign-overfit"
main = json.load(open(f"{out}/exponential/points.json"))
variants = {v: json.load(open(f"{out}/{v}/points.json"))["summary"] for v in ("logistic", "student_t")}
s = main["summary"]
results = {"max_abs_err_vs_reference": s["max_abs_err_vs_reference"], "max_train_error": s["max_train_error"],
           "points": s["points"], "min_cos_half_final": s["min_cos_half_final"], "grid": main["points"],
           "variants": variants}
json.dump(results, open(f"{out}/results.json", "w"), indent=2)
print(f"{'n':>4} {'d':>5} {'|mu|':>5} {'train':>6} {'test':>7} {'ref':>7} {'|diff|':>7} {'cos(W_T/2,W_T)':>15}")
for p in main["points"]:
    print(f"{p['n']:4d} {p['d']:5d} {p['mu_norm']:5.1f} {p['train_error']:6.3f} {p['test_error']:7.3f} "
          f"{p['reference']:7.3f} {p['abs_err']:7.3f} {p['cos_half_final']:15.6f}")
print(f"exponential: max |test - ref| {s['max_abs_err_vs_reference']:.3f}, max train error {s['max_train_error']}")
for name, v in variants.items():
    print(f"{name}: max |test - ref| {v['max_abs_err_vs_reference']:.3f}, max train error {v['max_train_error']}")
PY
