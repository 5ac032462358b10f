"""Choose EAMET's alignment weight on validation facts that are in no test set (bench.split_pool).

    python examples/eamet/select_weight.py [--scales 1,0.1,0.01,0.001] [--model zoo:smollm2-135m] [--n 30]

The paper's cs_factor 2 / mse_factor 8 are scaled together by each factor; MEMIT runs beside them as a reference
(not a candidate). Rule, fixed before any run: the highest validation strict efficacy; ties go to the higher
key–δ Spearman (more of EAMET's alignment kept). The test sets are never read. Rows and the choice go to
runs/eamet-val/results.json. Same run settings as the repro, made cheaper for the sweep (VAL_SET below).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench  # noqa: E402

VAL_SET = ["--set", "context_prefixes=0", "--set", "cov_tokens=20000", "--set", "fluency_samples=10",
           "--set", "fluency_tokens=30", "--set", "clamp_factor=10"]


def choose(rows: list[dict]) -> dict:
    """The rule above, over the EAMET rows."""
    candidates = [r for r in rows if r["method"] == "EAMET"]
    return max(candidates, key=lambda r: (r["efficacy"], r["alignment_spearman"] or float("-inf")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scales", default="1,0.1,0.01,0.001")
    parser.add_argument("--model", default="zoo:smollm2-135m")
    parser.add_argument("--n", type=int, default=bench.VALIDATION)
    args = parser.parse_args()
    bench.OUT = Path("runs/eamet-val")
    bench.OUT.mkdir(parents=True, exist_ok=True)
    pool, validation = bench.split_pool(bench.real_pool())
    validation = validation[:args.n]
    bench.check_disjoint(validation, bench.test_facts(pool, len(pool))[0])
    facts = bench.write_facts(validation, "facts-val.jsonl")
    rows = [{**bench.run_one(args.model, len(validation), "memit", facts, VAL_SET), "scale": None}]
    for scale in (float(x) for x in args.scales.split(",")):
        extra = VAL_SET + ["--set", f"cs_factor={2 * scale:g}", "--set", f"mse_factor={8 * scale:g}"]
        row = bench.run_one(args.model, len(validation), "eamet", facts, extra)
        rows.append({**row, "scale": scale})
        print(json.dumps(rows[-1]), flush=True)
    chosen = choose(rows)
    (bench.OUT / "results.json").write_text(json.dumps({"rows": rows, "chosen_scale": chosen["scale"]}, indent=2))
    print(f"chosen: alignment x{chosen['scale']:g} (validation efficacy {chosen['efficacy']})")


if __name__ == "__main__":
    main()
