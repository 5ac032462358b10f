"""Summarise examples/mhlp/seeds.sh: per-seed rows and mean ± sd (sample sd, n - 1) of accuracy / ECE / Brier per
method, and the per-seed ECE difference MHLP - single. Usage: python examples/mhlp/seeds_table.py runs/mhlp-seeds
[--committed examples/mhlp/results.json]: --committed fills the seeds that have no finished seedN.json under the run
folder from the per-seed rows ("<method> seed N", with "seed") of a committed results.json."""

import argparse
import json
import statistics
from pathlib import Path

parser = argparse.ArgumentParser()
parser.add_argument("root", type=Path)
parser.add_argument("--committed", type=Path, help="results.json whose per-seed rows fill the seeds not run here")
args = parser.parse_args()
root = args.root
per_seed, source = {}, {}
for path in sorted(root.glob("seed*.json")):
    try:
        metrics = json.loads(path.read_text())["metrics"]
    except (json.JSONDecodeError, KeyError):
        continue  # unfinished
    seed = int(path.stem.removeprefix("seed"))
    per_seed[seed], source[seed] = metrics, str(path)
if args.committed:
    committed = {}
    for row in json.loads(args.committed.read_text())["rows"]:
        seed = row.get("seed")
        if seed is None or seed in per_seed:
            continue
        m = committed.setdefault(seed, {"acceptance_rate": row.get("acceptance_rate"), "n_eval": row.get("n_eval"),
                                        "rows": []})
        m["rows"].append({"method": row["method"].removesuffix(f" seed {seed}"),
                          "confidence": row.get("mean_confidence"), **{k: row[k] for k in ("accuracy", "ece", "brier")}})
    for seed, m in committed.items():
        per_seed[seed], source[seed] = m, f"{args.committed} (committed rows)"
for seed in sorted(per_seed):
    print(f"seed {seed}: {source[seed]}")
rows = []
for seed, metrics in sorted(per_seed.items()):
    for row in metrics["rows"]:
        rows.append({"seed": seed, "source": source[seed], "acceptance_rate": metrics.get("acceptance_rate"),
                     "n_eval": metrics.get("n_eval"),
                     **{k: row[k] for k in ("method", "accuracy", "ece", "brier") if k in row},
                     "mean_confidence": row.get("confidence")})
print(f"{'seed':>4} {'method':<10} {'acc':>6} {'ece':>6} {'brier':>6} {'conf':>6} {'accept':>6}")
for r in rows:
    print(f"{r['seed']:>4} {r['method']:<10} {r['accuracy']:6.3f} {r['ece']:6.3f} {r['brier']:6.3f} "
          f"{(r['mean_confidence'] or float('nan')):6.3f} {(r['acceptance_rate'] or 0):6.2f}")
summary = {}
for method in dict.fromkeys(r["method"] for r in rows):
    sel = [r for r in rows if r["method"] == method]
    summary[method] = {"n_seeds": len(sel)}
    for key in ("accuracy", "ece", "brier"):
        vals = [r[key] for r in sel]
        summary[method][key] = {"mean": statistics.mean(vals), "sd": statistics.stdev(vals) if len(vals) > 1 else None}
ece = {s: {row["method"]: row["ece"] for row in m["rows"]} for s, m in sorted(per_seed.items())}
paired = [s for s, v in ece.items() if "mhlp" in v and "single" in v]
diffs = [ece[s]["mhlp"] - ece[s]["single"] for s in paired]
summary["ece_mhlp_minus_single"] = {"seeds": paired, "per_seed": diffs, "mean": statistics.mean(diffs) if diffs else None,
                                    "sd": statistics.stdev(diffs) if len(diffs) > 1 else None}
for method, s in summary.items():
    print(method, json.dumps(s))
(root / "seeds_summary.json").write_text(json.dumps({"rows": rows, "summary": summary}, indent=2))
