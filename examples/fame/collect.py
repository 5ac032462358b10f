"""Collect the runs of examples/fame/repro.sh into results.json and print the table."""

import json
import sys
from pathlib import Path

METHODS = {"fame": "FAME", "verix": "VeriX", "verix-exact": "VeriX (exact MILP oracle)",
           "fame-refine": "FAME + exact refinement"}


def samples(run: Path) -> dict:
    return {s["index"]: s for s in json.loads((run / "explanations.json").read_text())["samples"]}


def row(run: Path, model: str, key: str) -> dict:
    metrics = json.loads((run / "run.json").read_text())["metrics"]
    out = {"model": model, "method": METHODS[key], "n_images": metrics["n_explained"],
           "mean_size": metrics["mean_size"], "mean_seconds": metrics["mean_seconds"],
           "mean_dist_to_minimal": metrics["mean_dist_to_minimal"],
           "verified_fraction": metrics.get("verified_fraction"), "mean_size_min": metrics["mean_size_min"],
           "mean_attack_seconds": metrics["mean_attack_seconds"], "skipped_robust": metrics["skipped_robust"],
           "skipped_misclassified": metrics["skipped_misclassified"]}
    if key == "fame-refine":  # the refined explanation; time = FAME + attack (prunes) + MILP refinement
        out["mean_size"] = metrics["mean_refined_size"]
        out["mean_seconds"] = metrics["mean_seconds"] + metrics["mean_attack_seconds"] + metrics["mean_refine_seconds"]
        out["mean_dist_to_minimal"] = metrics["mean_refined_dist_to_minimal"]  # pixels the MILP left undecided
        out["mean_size_min"] = metrics["mean_refined_size_min"]  # attack- or MILP-proven necessary pixels
    return out


def main(root: Path) -> None:
    rows = []
    for model in ("digits-mlp", "digits-cnn"):
        for key in METHODS:
            run = root / f"{model}-{key}"
            if (run / "run.json").exists():
                rows.append(row(run, model, key))
    result = {"epsilon": 0.05, "rows": rows}
    exact, refined = root / "digits-mlp-verix-exact", root / "digits-mlp-fame-refine"  # same first images
    if exact.exists() and refined.exists():
        truth, ours = samples(exact), samples(refined)
        common = sorted(set(truth) & set(ours))
        result["mlp_exact_comparison"] = {
            "images": len(common),
            "fame_refined_smaller_or_equal_to_verix_exact": sum(ours[i]["refined_size"] <= truth[i]["size"]
                                                                for i in common),
            "fame_refined_strictly_smaller": sum(ours[i]["refined_size"] < truth[i]["size"] for i in common),
            "size_min_le_minimal_le_size": sum(ours[i]["size_min"] <= ours[i]["refined_size"] <= ours[i]["size"]
                                               for i in common)}
    (root / "results.json").write_text(json.dumps(result, indent=2))
    print(f"{'model':<11} {'method':<28} {'n':>4} {'size':>7} {'sec':>8} {'dist':>6} {'size_min':>8} {'verified':>8}")
    for r in rows:
        verified = "-" if r["verified_fraction"] is None else f"{r['verified_fraction']:.2f}"
        print(f"{r['model']:<11} {r['method']:<28} {r['n_images']:>4} {r['mean_size']:>7.2f} {r['mean_seconds']:>8.3f} "
              f"{r['mean_dist_to_minimal']:>6.2f} {r['mean_size_min']:>8.2f} {verified:>8}")
    if "mlp_exact_comparison" in result:
        print("MLP exact comparison:", json.dumps(result["mlp_exact_comparison"]))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
