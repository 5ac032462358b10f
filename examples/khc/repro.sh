#!/usr/bin/env bash
# k-HC2 benchmark: 10 seeded planted instances (n 20-30, d 2-3, k 2-3), the four formulations solved by SCIP from
# scratch (the paper's protocol: no warm start), plus the default warm-started inf run and the k-planes heuristic.
# Writes runs/repro-khc/results.json and prints a table. Budget: TIME_LIMIT seconds per SCIP run (default 45),
# so at most 10 x 5 x 45 s; typically ~25 min on 2 shared cores.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=runs/repro-khc
TIME_LIMIT=${TIME_LIMIT:-45}
mkdir -p "$OUT/instances"
OUT="$OUT" TIME_LIMIT="$TIME_LIMIT" .venv/bin/python - <<'PY'
import json, math, os, statistics
import numpy as np
from toolkit.cluster.khc import FORMULATIONS, planted_instance, solve

out, limit = os.environ["OUT"], float(os.environ["TIME_LIMIT"])
INSTANCES = [(20, 2, 2, 1), (22, 2, 2, 2), (24, 2, 2, 3), (26, 2, 2, 4), (30, 2, 2, 5),
             (20, 2, 3, 6), (24, 2, 3, 7), (20, 3, 2, 8), (22, 3, 2, 9), (20, 3, 2, 10)]
record = {"time_limit_s": limit, "protocol": "rows: SCIP from scratch (no warm start), seed 0, 1 thread; "
          "warm_rows: formulation inf with the k-planes incumbent (the CLI default)", "rows": [], "warm_rows": [],
          "heuristic": []}

def row(name, formulation, r):
    return {"instance": name, "formulation": formulation, "status": r.status, "objective": r.objective,
            "dual_bound": r.dual_bound, "gap": r.gap, "nodes": r.nodes, "seconds": round(r.seconds, 2)}

for n, d, k, seed in INSTANCES:
    name = f"n{n}-d{d}-k{k}-s{seed}"
    points = planted_instance(n, d, k, seed=seed).points
    np.savetxt(f"{out}/instances/{name}.csv", points, delimiter=",", fmt="%.10g",
               header=",".join(f"x{c}" for c in range(d)), comments="")
    for formulation in FORMULATIONS:
        r = solve(points, k, formulation, time_limit=limit, warm_start=False, seed=0)
        record["rows"].append(row(name, formulation, r))
        print(f"{name:16s} {formulation:6s} {r.status:10s} obj {r.objective:.6g} nodes {r.nodes:7d} "
              f"{r.seconds:6.1f}s", flush=True)
    r = solve(points, k, "inf", time_limit=limit, warm_start=True, seed=0)
    record["warm_rows"].append(row(name, "inf+warm", r))
    solved = [x["objective"] for x in record["rows"] + record["warm_rows"]
              if x["instance"] == name and x["status"] == "optimal"]
    best = min(solved) if solved else None
    record["heuristic"].append({"instance": name, "objective": r.heuristic_objective, "proven_optimum": best,
                                "gap": None if best is None else (r.heuristic_objective - best) / best})
    with open(f"{out}/results.json", "w") as f:
        json.dump(record, f, indent=2)

rows = record["rows"]
print(f"\n{'instance':16s} " + " ".join(f"{f:>22s}" for f in FORMULATIONS) + f" {'inf+warm':>22s}  heur.gap")
for (n, d, k, seed), h in zip(INSTANCES, record["heuristic"]):
    name = h["instance"]
    cells = [next(x for x in rows if x["instance"] == name and x["formulation"] == f) for f in FORMULATIONS]
    cells.append(next(x for x in record["warm_rows"] if x["instance"] == name))
    text = " ".join(f"{x['nodes']:>9d}n {x['seconds']:6.1f}s{'' if x['status'] == 'optimal' else '*':1s}   "
                    for x in cells)
    print(f"{name:16s} {text} {'-' if h['gap'] is None else format(h['gap'], '.2e')}")
for f in FORMULATIONS[1:]:
    ratios = [max(p["nodes"], 1) / max(s["nodes"], 1) for p, s in
              zip([x for x in rows if x["formulation"] == "plain"], [x for x in rows if x["formulation"] == f])]
    print(f"plain/{f} nodes, geometric mean: {math.exp(statistics.mean(map(math.log, ratios))):.2f}x")
print("* = time limit hit (nodes and seconds are then lower bounds on the effort)")
PY
