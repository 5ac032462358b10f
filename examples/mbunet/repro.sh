#!/usr/bin/env bash
# MBU-Net on the procedural segmentation benchmark: fp32 vs plain binary vs masked binary (cost-aware masks at
# 0.5x extra bit-ops, the row the gate reads) vs masked binary on every layer (TWN threshold rule, 2x bit-ops),
# packed conversion (exactness checked), packed CPU speed at 256x256 batch 1 on 2 threads.
# SEEDS (default "1 2"): binary and masked are trained again with these seeds (the seed also redraws scenes and split)
# -> rows under "seed_rows" with the mean and sd over seed 0 and them ("" skips).
# Writes runs/repro-mbunet/results.json (every record stamped by scripts/provenance.py) and prints a table. Sized for
# 2 shared CPU cores (~25 min under load; ~45 min with the two extra seeds).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
R=runs/repro-mbunet
STEPS="${STEPS:-1200}"
SEEDS="${SEEDS-1 2}"
LOAD_START="$(cut -d' ' -f1-3 /proc/loadavg)"
CODE_START="$($PY scripts/provenance.py state)"
export OMP_NUM_THREADS=1  # the four trainings run side by side, one thread each; the speed bench uses 2
mkdir -p "$R"
trap 'kill $(jobs -p) 2>/dev/null || true' EXIT
COMMON=(--data procedural --config examples/mbunet/config.yaml --steps "$STEPS" --seed 0 --overwrite)
pids=()
for variant in fp32 binary masked; do
  $PY -m cli.main -q segment mbunet train --variant "$variant" "${COMMON[@]}" --out "$R/$variant" > "$R/$variant.log" 2>&1 &
  pids+=($!)
done
# every binary layer masked, zeros by TWN's rule |w| <= 0.7 mean|w| per channel (budget 1.0 = all layers)
$PY -m cli.main -q segment mbunet train --variant masked "${COMMON[@]}" --set mask_rule=threshold --set mask_ratio=0.7 \
  --mask-budget 1.0 --out "$R/masked-all" > "$R/masked-all.log" 2>&1 &
pids+=($!)
for seed in $SEEDS; do
  for variant in binary masked; do
    $PY -m cli.main -q segment mbunet train --variant "$variant" "${COMMON[@]}" --seed "$seed" \
      --out "$R/seed$seed/$variant" > "$R/$variant-seed$seed.log" 2>&1 &
    pids+=($!)
  done
done
for pid in "${pids[@]}"; do wait "$pid"; done
echo "trained fp32, binary, masked, masked-all (seed 0); binary, masked for seeds: ${SEEDS:-none}" >&2
for variant in binary masked masked-all; do
  $PY -m cli.main -q segment mbunet convert --model "$R/$variant" --out "$R/$variant-packed" --overwrite > /dev/null
done
$PY -m cli.main -q segment mbunet infer --model "$R/masked-packed" --data procedural --limit 6 --out "$R/infer" \
  --overwrite > /dev/null
$PY -m cli.main -q segment mbunet bench --model "$R/masked-packed" --size 256 --threads 2 --repeats 20 \
  --out "$R/bench" --overwrite > /dev/null
# the same timings as one thread's CPU time: other processes on a shared machine cannot inflate them
$PY -m cli.main -q segment mbunet bench --model "$R/masked-packed" --size 256 --threads 1 --repeats 10 \
  --set timer=thread-cpu --out "$R/bench-cpu" --overwrite > /dev/null
$PY - "$R" <<'PYEOF'
import json, statistics, sys
from pathlib import Path

r = Path(sys.argv[1])
load = lambda p: json.loads((r / p / "run.json").read_text())["metrics"]
fp32 = json.loads((r / "fp32" / "run.json").read_text())
import torch
from toolkit.segment.mbunet import load_model
from toolkit.segment.packed import float_model_bytes
fp32_kb = float_model_bytes(load_model(r / "fp32")[0]) / 1024
rows = [{"variant": "fp32", "miou": load("fp32")["miou"], "weights_kb": fp32_kb, "iou": load("fp32")["iou"]}]
names = {"binary": "binary", "masked": "masked-binary", "masked-all": "masked-binary all layers (TWN)"}
for v, name in names.items():
    m, c = load(v), load(f"{v}-packed")
    rows.append({"variant": name, "miou": m["miou"], "weights_kb": c["packed_kb"], "iou": m["iou"],
                 "exact_conversion": c["exact"], "bitops_vs_binary": m["bitops_vs_binary"],
                 "mask_rule": m.get("mask_rule"), "mask_ratios": m["mask_ratios"],
                 "zero_fraction": m.get("zero_fraction"), "loss_last": m["loss_last"]})
rows[0]["loss_last"] = load("fp32")["loss_last"]
b, c = load("bench"), load("bench-cpu")
speed = {"fp32_ms": b["fp32_ms"], "packed_ms": b["packed_ms"], "shape": b["shape"], "threads": b["threads"],
         "timer": "wall, best of 20", "network_fp32_ms": b["network_fp32_ms"],
         "network_packed_ms": b["network_packed_ms"], "cpu1_fp32_ms": c["fp32_ms"], "cpu1_packed_ms": c["packed_ms"],
         "cpu1_network_fp32_ms": c["network_fp32_ms"], "cpu1_network_packed_ms": c["network_packed_ms"]}
for row in rows:
    row.update(seed=0, steps=fp32["config"]["steps"])
seed_rows = []
for name, v in (("binary", "binary"), ("masked-binary", "masked")):
    per = {0: load(v)}
    per.update({int(p.parent.parent.name[4:]): json.loads(p.read_text())["metrics"]
                for p in sorted(r.glob(f"seed*/{v}/run.json"))})
    if len(per) == 1:
        continue
    for seed, m in sorted(per.items()):
        seed_rows.append({"variant": name, "seed": seed, "miou": round(m["miou"], 2), "iou": m["iou"],
                          "loss_last": m["loss_last"], "bitops_vs_binary": m["bitops_vs_binary"],
                          "steps": fp32["config"]["steps"]})
    mious = [round(m["miou"], 2) for m in per.values()]
    seed_rows.append({"variant": name, "seed": "mean", "seeds": sorted(per), "n_seeds": len(mious),
                      "miou_mean": round(statistics.fmean(mious), 2), "miou_sd": round(statistics.stdev(mious), 2)})
out = {"rows": rows, "speed": speed}
if seed_rows:
    out["seed_rows"] = seed_rows
(r / "results.json").write_text(json.dumps(out, indent=2))
print(f"{'variant':<32}{'mIoU':>8}{'weights KB':>12}{'bit-ops':>9}  per-class IoU")
for row in rows:
    per = " ".join(f"{k}={v:.1f}" for k, v in row["iou"].items() if v is not None)
    ops = f"{row['bitops_vs_binary']:.2f}x" if row.get("bitops_vs_binary") else "-"
    print(f"{row['variant']:<32}{row['miou']:>8.2f}{row['weights_kb']:>12.1f}{ops:>9}  {per}")
print(f"binary layers at {speed['shape']}, {speed['threads']} threads: torch fp32 conv {speed['fp32_ms']:.1f} ms, "
      f"packed {speed['packed_ms']:.1f} ms ({speed['fp32_ms'] / speed['packed_ms']:.2f}x); whole network "
      f"{speed['network_fp32_ms']:.1f} vs {speed['network_packed_ms']:.1f} ms")
print(f"one thread, CPU time: binary layers fp32 {speed['cpu1_fp32_ms']:.1f} ms, packed {speed['cpu1_packed_ms']:.1f} ms "
      f"({speed['cpu1_fp32_ms'] / speed['cpu1_packed_ms']:.2f}x); whole network {speed['cpu1_network_fp32_ms']:.1f} "
      f"vs {speed['cpu1_network_packed_ms']:.1f} ms")
for row in seed_rows:
    if row["seed"] == "mean":
        print(f"{row['variant']}: mIoU {row['miou_mean']:.2f} +- {row['miou_sd']:.2f} over seeds {row['seeds']}")
PYEOF
$PY scripts/provenance.py stamp "$R/results.json" --repro examples/mbunet/repro.sh --load-start "$LOAD_START" \
  --code-start "$CODE_START" \
  --command "STEPS=$STEPS SEEDS='$SEEDS' bash examples/mbunet/repro.sh" --seed 0
