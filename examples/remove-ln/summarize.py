"""Collect the remove-ln repro runs into runs/repro-remove-ln/results.json and print the tables."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def load(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def scaling_rows(out: Path) -> list[dict]:
    rows = []
    for path in (out / "scaling").glob("L*-b*.json"):
        record = load(path)
        if not record:
            continue
        m = record["metrics"]
        rows.append({"layers": int(path.stem[1:].split("-b")[0]), "train_tokens": m["train_tokens"],
                     "ce_original": m["ce_original"], "ce_ln_free": m["ce_ln_free"],
                     "ce_naive_removal": m["ce_naive_removal"], "gap_vs_original": m["ce_ln_free"] - m["ce_original"]})
    return sorted(rows, key=lambda r: (r["layers"], r["train_tokens"]))


def tokens_needed(rows: list[dict], tolerance: float) -> dict:
    """Per depth: the smallest swept budget whose LN-free CE is within `tolerance` nats of the original model's."""
    need = {}
    for layers in sorted({r["layers"] for r in rows}):
        ok = [r["train_tokens"] for r in rows if r["layers"] == layers and r["gap_vs_original"] <= tolerance]
        need[str(layers)] = min(ok) if ok else None
    return need


def main(out: Path) -> None:
    main_run, plain, folded = load(out / "main.json"), load(out / "analyze_plain.json"), load(out /
                                                                                            "analyze_folded.json")
    if not (main_run and plain and folded):
        sys.exit(f"missing run outputs under {out}")
    m = main_run["metrics"]
    results = {
        "ce_original": m["ce_original"],
        "ce_vanilla_ft": main_run["baselines"]["ce_vanilla_ft"],
        "ce_ln_free": m["ce_ln_free"],
        "export_max_abs_logit_diff": m["export_max_abs_logit_diff"],
        "dla_max_abs_err": max(plain["metrics"]["dla_max_abs_err"], folded["metrics"]["dla_max_abs_err"]),
        "train_tokens": m["train_tokens"],
        "ce_naive_removal": m["ce_naive_removal"],
        "ce_fakeln": m["ce_fakeln"],
        "export_diffs": m["export_diffs"],
        "dla_max_abs_err_original_fixed_scale": plain["baselines"]["dla_max_abs_err"],
        "dla_top_components_ln_free": plain["metrics"]["top_components"],
        "model": main_run["inputs"].get("model"),
        "duration_s": main_run["duration_s"],
    }
    rows = scaling_rows(out)
    if rows:
        results["scaling"] = rows
        results["scaling_tokens_needed"] = {f"gap_vs_original_le_{t}": tokens_needed(rows, t) for t in (0.02, 0.05)}
    (out / "results.json").write_text(json.dumps(results, indent=2))
    print("| metric | value |\n|---|---|")
    for key in ("ce_original", "ce_vanilla_ft", "ce_ln_free", "ce_naive_removal", "export_max_abs_logit_diff",
                "dla_max_abs_err", "dla_max_abs_err_original_fixed_scale", "train_tokens"):
        value = results[key]
        print(f"| {key} | {value:.4g} |" if isinstance(value, float) else f"| {key} | {value} |")
    print(f"| ce_ln_free - ce_vanilla_ft | {results['ce_ln_free'] - results['ce_vanilla_ft']:+.4f} |")
    if rows:
        print("\n| layers | train tokens | CE original | CE LN-free | CE naive removal | LN-free - original |")
        print("|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['layers']} | {r['train_tokens']} | {r['ce_original']:.4f} | {r['ce_ln_free']:.4f} | "
                  f"{r['ce_naive_removal']:.4f} | {r['gap_vs_original']:+.4f} |")
        print("\ntokens needed:", results["scaling_tokens_needed"])


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "runs/repro-remove-ln"))
