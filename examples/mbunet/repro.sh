#!/usr/bin/env bash
# MBU-Net on the procedural segmentation benchmark: fp32 vs plain binary vs masked binary (cost-aware masks at
# 0.5x extra bit-ops, the row the gate reads) vs masked binary on every layer (TWN threshold rule, 2x bit-ops),
# packed conversion (exactness checked), packed CPU speed at 256x256 batch 1 on 2 threads.
# Writes runs/repro-mbunet/results.json and prints a table. Sized for 2 shared CPU cores (~25 min under load).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
R=runs/repro-mbunet
STEPS="${STEPS:-1200}"
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
for pid in "${pids[@]}"; do wait "$pid"; done
echo "trained fp32, binary, masked, masked-all" >&2
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
import json, sys
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
(r / "results.json").write_text(json.dumps({"rows": rows, "speed": speed}, indent=2))
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
PYEOF
