"""Mean +- sd over calibration seeds of seeds.sh's runs; a "win" needs the means apart by more than both sds.

Usage: seeds_table.py OUT [COMMITTED.json]. Writes OUT/results.json: one row per run (model, setting, method, seed,
ppl, seconds, sparsity, nsamples, seqlen) and one summary row per (setting, method) (seed "mean", ppl_mean, ppl_sd,
n_seeds). With COMMITTED.json (examples/obr/results.json) the rows are merged into it under key "seed_rows"
(replaced as a whole), the file's other keys kept.
"""

import json
import statistics
import sys
from pathlib import Path

METHODS = {"obr-gptq": "OBR_GPTQ", "sparsegpt-two-stage": "SparseGPT->GPTQ two-stage",
           "two-stage-unrotated": "SparseGPT->GPTQ two-stage (unrotated)", "obr-unrotated": "OBR_GPTQ (unrotated)",
           "wanda-rtn": "Wanda+RTN"}
BASELINES = ("SparseGPT->GPTQ two-stage", "SparseGPT->GPTQ two-stage (unrotated)")  # OBR's verdicts, each one


def runs(out: Path) -> list[dict]:
    rows = []
    for path in sorted(out.glob("*/*-s*/run.json")):
        setting = path.parent.parent.name.replace("-2-4", "-2:4")
        method, seed = path.parent.name.rsplit("-s", 1)
        record = json.loads(path.read_text())
        m = record["metrics"]
        rows.append({"model": "smollm2-135m", "setting": setting, "method": METHODS.get(method, method),
                     "seed": int(seed), "ppl": round(m["ppl"], 3), "seconds": round(m["compress_seconds"], 1),
                     "sparsity": m.get("sparsity"), "nsamples": m.get("calibration_windows"),
                     "seqlen": m.get("seqlen"), "rotate": bool(m.get("rotated")),
                     "hadamard": m.get("hadamard")})
    return rows


def summaries(rows: list[dict]) -> list[dict]:
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["setting"], r["method"]), []).append(r)
    out = []
    for (setting, method), members in groups.items():
        ppl = [r["ppl"] for r in members]
        out.append({"model": "smollm2-135m", "setting": setting, "method": method, "seed": "mean",
                    "seeds": sorted(r["seed"] for r in members), "n_seeds": len(ppl),
                    "ppl_mean": round(statistics.fmean(ppl), 3),
                    "ppl_sd": round(statistics.stdev(ppl), 3) if len(ppl) > 1 else None,
                    "seconds_mean": round(statistics.fmean(r["seconds"] for r in members), 1)})
    return out


def verdicts(summary: list[dict]) -> list[str]:
    lines = []
    by_setting: dict[str, dict[str, dict]] = {}
    for s in summary:
        by_setting.setdefault(s["setting"], {})[s["method"]] = s
    for setting, methods in by_setting.items():
        obr = methods.get("OBR_GPTQ")
        for name in BASELINES:
            base = methods.get(name)
            if base is None:
                continue
            label = name.replace("SparseGPT->GPTQ ", "")
            if not obr or obr["n_seeds"] < 2 or base["n_seeds"] < 2:
                lines.append(f"{setting}: OBR vs {label}: fewer than 2 seeds for one method: no verdict")
                continue
            gap = base["ppl_mean"] - obr["ppl_mean"]
            beyond = abs(gap) > max(obr["ppl_sd"], base["ppl_sd"])
            who = "OBR" if gap > 0 else label
            lines.append(f"{setting}: OBR vs {label}: {who} lower by {abs(gap):.2f} ppl; "
                         f"{'beyond' if beyond else 'NOT beyond'} the seed sd "
                         f"(OBR sd {obr['ppl_sd']:.2f}, {label} sd {base['ppl_sd']:.2f}; "
                         f"{min(obr['n_seeds'], base['n_seeds'])} seeds)")
    return lines


def main(out: Path, committed: Path | None = None) -> None:
    rows = runs(out)
    summary = summaries(rows)
    (out / "results.json").write_text(json.dumps({"rows": rows + summary}, indent=2))
    if committed is not None:
        data = json.loads(committed.read_text()) if committed.is_file() else {"rows": []}
        data["seed_rows"] = rows + summary
        committed.write_text(json.dumps(data, indent=2) + "\n")
    print("| setting | method | seeds | ppl per seed | mean ± sd | seconds (mean) |")
    print("|---|---|---|---|---|---:|")
    for s in summary:
        per_seed = ", ".join(f"{r['ppl']:.2f}" for r in rows
                             if (r["setting"], r["method"]) == (s["setting"], s["method"]))
        sd = f"{s['ppl_sd']:.2f}" if s["ppl_sd"] is not None else "-"
        print(f"| {s['setting']} | {s['method']} | {s['seeds']} | {per_seed} | {s['ppl_mean']:.2f} ± {sd} | "
              f"{s['seconds_mean']:.1f} |")
    for line in verdicts(summary):
        print(line)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]) if len(sys.argv) > 2 else None)
