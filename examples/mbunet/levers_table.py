"""Summarise examples/mbunet/levers.sh: mIoU per lever and seed, mean over seeds, and the gap to fp32.
Usage: python examples/mbunet/levers_table.py runs/mbunet-levers  (writes levers_summary.json there)"""

import json
import statistics
import sys
from pathlib import Path

root = Path(sys.argv[1])
names = ["fp32", "masked", "shortcut", "reactnet", "reactnet-2stage", "reactnet-kd"]
table = {}
for seed_dir in sorted(root.glob("seed*")):
    seed = int(seed_dir.name.removeprefix("seed"))
    for name in names:
        path = seed_dir / name / "run.json"
        if path.is_file():
            record = json.loads(path.read_text())
            metrics = record.get("metrics", record)
            table.setdefault(name, {})[seed] = {"miou": metrics["miou"], "loss_last": metrics.get("loss_last"),
                                               "bitops_vs_binary": metrics.get("bitops_vs_binary"),
                                               "duration_s": record.get("duration_s")}
seeds = sorted({s for v in table.values() for s in v})
print(f"{'variant':<18}" + "".join(f"{'seed ' + str(s):>10}" for s in seeds) + f"{'mean':>8}{'sd':>7}{'vs masked':>10}")
summary = {}
for name in names:
    if name not in table:
        continue
    vals = [table[name][s]["miou"] for s in seeds if s in table[name]]
    mean = statistics.mean(vals)
    sd = statistics.stdev(vals) if len(vals) > 1 else float("nan")
    base = [table[name][s]["miou"] - table["masked"][s]["miou"] for s in seeds
            if s in table[name] and s in table.get("masked", {})]
    summary[name] = {"per_seed": table[name], "mean": mean, "sd": sd,
                     "minus_masked_mean": statistics.mean(base) if base else None}
    print(f"{name:<18}" + "".join(f"{table[name][s]['miou']:10.2f}" if s in table[name] else f"{'-':>10}"
                                  for s in seeds) + f"{mean:8.2f}{sd:7.2f}"
          + (f"{summary[name]['minus_masked_mean']:+10.2f}" if base else ""))
(root / "levers_summary.json").write_text(json.dumps(summary, indent=2))
