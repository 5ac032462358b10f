"""Compare two trees' runs of the same commands, case by case: every tensor, every metric, every other output.

    python compare_runs.py RUNS_BEFORE RUNS_AFTER [--json OUT.json]

Each RUNS_* holds one directory per case (the command's --out), CASE.cmd (the command line) and CASE.rc (its exit
status), as equivalence.sh writes them. For each case:
  * tensors: every *.safetensors file (and *.pt, loaded with weights_only) under the out dir, tensor by tensor:
    names, dtype, shape, torch.equal, max |before - after| (in float64);
  * metrics: run.json's `metrics` and `baselines` leaf by leaf (numbers: max |diff|; anything else: equality),
    after dropping volatile keys (VOLATILE: timing, dates, paths, versions, sha) and writing both trees' paths as
    <TREE>/<OUT>; other *.json / *.jsonl outputs the same way (whole file);
  * everything else (model cards, YAML, GGUF, PNG, ...): same file set, and byte equality where no path or date can
    legitimately differ (TEXT_WITH_PATHS are compared after the same normalisation, line by line).
A case is identical when the exit codes match, the file sets match, and every tensor, metric and file is equal.
Prints a Markdown table; exits 1 when a case differs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import re
import sys
from pathlib import Path

VOLATILE = re.compile(r"(^|_)(time|times|timing|duration|wall|elapsed|started|finished|date|created|timestamp|"
                      r"sha|git|version|versions|env|host|hostname|pid|path|paths|dir|command|argv|cwd|"
                      r"seconds|ms|s|sec|it_per_s|tokens_per_s|throughput|speed|fingerprint_path)($|_)", re.I)
RUN_JSON_SECTIONS = ("metrics", "baselines")
TEXT_WITH_PATHS = {".md", ".yaml", ".yml", ".txt", ".log"}


def normalise(value, subs):
    if isinstance(value, dict):
        return {k: normalise(v, subs) for k, v in value.items() if not VOLATILE.search(str(k))}
    if isinstance(value, list):
        return [normalise(v, subs) for v in value]
    if isinstance(value, str):
        for old, new in subs:
            value = value.replace(old, new)
        return value
    return value


def leaf_diff(a, b, where="") -> tuple[list[str], float]:
    """Differences between two JSON values (paths of the differing leaves) and the max |diff| over numeric leaves."""
    if isinstance(a, dict) and isinstance(b, dict):
        diffs, worst = [], 0.0
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                diffs.append(f"{where}.{k} only in {'after' if k not in a else 'before'}")
                continue
            d, w = leaf_diff(a[k], b[k], f"{where}.{k}")
            diffs += d
            worst = max(worst, w)
        return diffs, worst
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{where} length {len(a)} != {len(b)}"], 0.0
        diffs, worst = [], 0.0
        for i, (x, y) in enumerate(zip(a, b)):
            d, w = leaf_diff(x, y, f"{where}[{i}]")
            diffs += d
            worst = max(worst, w)
        return diffs, worst
    numbers = (int, float)
    if isinstance(a, numbers) and isinstance(b, numbers) and not isinstance(a, bool) and not isinstance(b, bool):
        if a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)):
            return [], 0.0
        return [f"{where}: {a!r} != {b!r}"], abs(float(a) - float(b))
    return ([] if a == b else [f"{where}: {a!r} != {b!r}"]), 0.0


def load_tensors(path: Path) -> dict:
    import torch

    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    obj = torch.load(path, map_location="cpu", weights_only=True)
    flat = {}

    def walk(x, prefix):
        if isinstance(x, torch.Tensor):
            flat[prefix] = x
        elif isinstance(x, dict):
            for k, v in x.items():
                walk(v, f"{prefix}.{k}" if prefix else str(k))
        elif isinstance(x, (list, tuple)):
            for i, v in enumerate(x):
                walk(v, f"{prefix}[{i}]")
        else:
            flat[prefix] = x
    walk(obj, "")
    return flat


def compare_tensors(fa: Path, fb: Path) -> tuple[int, list[str], float]:
    import torch

    a, b = load_tensors(fa), load_tensors(fb)
    diffs, worst = [], 0.0
    for k in sorted(set(a) | set(b)):
        if k not in a or k not in b:
            diffs.append(f"{k} only in {'after' if k not in a else 'before'}")
            continue
        x, y = a[k], b[k]
        if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
            if x != y:
                diffs.append(f"{k}: {x!r} != {y!r}")
            continue
        if x.dtype != y.dtype or x.shape != y.shape:
            diffs.append(f"{k}: {x.dtype}{tuple(x.shape)} != {y.dtype}{tuple(y.shape)}")
            continue
        if not torch.equal(x, y):
            d = (x.double() - y.double()).abs().max().item() if x.numel() else 0.0
            worst = max(worst, d)
            diffs.append(f"{k}: max |diff| {d:.3g}")
    return len(a), diffs, worst


def read_json(path: Path):
    text = path.read_text()
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    return json.loads(text)


def compare_case(case: str, ra: Path, rb: Path) -> dict:
    da, db = ra / case, rb / case
    subs_a = [(str(ra.parent.parent), "<ROOT>"), (str(da), "<OUT>"), (str(ra), "<RUNS>")]
    subs_b = [(str(rb.parent.parent), "<ROOT>"), (str(db), "<OUT>"), (str(rb), "<RUNS>")]
    for tree_file, subs in ((ra / f"{case}.tree", subs_a), (rb / f"{case}.tree", subs_b)):
        if tree_file.exists():
            subs.append((tree_file.read_text().strip(), "<TREE>"))
        subs.sort(key=lambda s: -len(s[0]))  # the longest path first (<OUT> before <ROOT>)
    rc = [(r / f"{case}.rc").read_text().strip() if (r / f"{case}.rc").exists() else "?" for r in (ra, rb)]
    row = {"case": case, "command": (ra / f"{case}.cmd").read_text().strip() if (ra / f"{case}.cmd").exists() else "",
           "rc": rc, "tensors": 0, "tensor_diffs": [], "tensor_max": 0.0, "metric_diffs": [], "metric_max": 0.0,
           "file_diffs": []}
    if rc[0] != rc[1] or rc[0] != "0":
        row["file_diffs"].append(f"exit status {rc[0]} / {rc[1]}")
    fa = {p.relative_to(da).as_posix() for p in da.rglob("*") if p.is_file()} if da.is_dir() else set()
    fb = {p.relative_to(db).as_posix() for p in db.rglob("*") if p.is_file()} if db.is_dir() else set()
    for name in sorted(fa ^ fb):
        row["file_diffs"].append(f"{name} only in {'before' if name in fa else 'after'}")
    for name in sorted(fa & fb):
        pa, pb = da / name, db / name
        if pa.suffix in (".safetensors", ".pt"):
            n, diffs, worst = compare_tensors(pa, pb)
            row["tensors"] += n
            row["tensor_diffs"] += [f"{name}: {d}" for d in diffs]
            row["tensor_max"] = max(row["tensor_max"], worst)
        elif name == "run.json":
            ja, jb = read_json(pa), read_json(pb)
            for sec in RUN_JSON_SECTIONS:
                diffs, worst = leaf_diff(normalise(ja.get(sec), subs_a), normalise(jb.get(sec), subs_b), sec)
                row["metric_diffs"] += diffs
                row["metric_max"] = max(row["metric_max"], worst)
            row["status"] = [ja.get("status"), jb.get("status")]
        elif pa.suffix in (".json", ".jsonl"):
            diffs, worst = leaf_diff(normalise(read_json(pa), subs_a), normalise(read_json(pb), subs_b), name)
            row["metric_diffs"] += diffs
            row["metric_max"] = max(row["metric_max"], worst)
        elif pa.suffix in (".yaml", ".yml"):  # resolved configs: compared as data (key order is not an output)
            import yaml

            diffs, _ = leaf_diff(normalise(yaml.safe_load(pa.read_text()), subs_a),
                                 normalise(yaml.safe_load(pb.read_text()), subs_b), name)
            row["file_diffs"] += diffs
        elif pa.suffix in TEXT_WITH_PATHS:
            ta, tb = normalise(pa.read_text(), subs_a), normalise(pb.read_text(), subs_b)
            if ta != tb:
                lines = [f"{x!r} != {y!r}" for x, y in zip(ta.splitlines(), tb.splitlines()) if x != y]
                row["file_diffs"].append(f"{name}: {lines[:2] or 'length differs'}")
        else:
            if hashlib.sha256(pa.read_bytes()).digest() != hashlib.sha256(pb.read_bytes()).digest():
                row["file_diffs"].append(f"{name}: bytes differ")
    row["identical"] = not (row["tensor_diffs"] or row["metric_diffs"] or row["file_diffs"])
    return row


def table_row(r: dict) -> dict:
    """One printed table row as data: what a script reads from the committed results.json."""
    return {"case": r["case"], "identical": r["identical"], "tensors": r["tensors"],
            "tensors_identical": not r["tensor_diffs"], "tensor_max_abs_diff": r["tensor_max"],
            "metrics_identical": not r["metric_diffs"], "metric_max_abs_diff": r["metric_max"],
            "other_outputs_identical": not r["file_diffs"],
            "differences": r["tensor_diffs"] + r["metric_diffs"] + r["file_diffs"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--json", type=Path, help="also write the full comparison here")
    ap.add_argument("--only", nargs="*", help="compare these cases only (default: every case in AFTER)")
    ap.add_argument("--rows", type=Path, help="write the table's rows (no machine paths) here, e.g. "
                    "examples/house/results.json")
    args = ap.parse_args()
    cases = args.only or sorted(p.stem for p in args.after.glob("*.cmd"))
    rows = [compare_case(c, args.before.resolve(), args.after.resolve()) for c in cases]
    yes = {True: "yes", False: "NO"}
    print("| case | identical | tensors (n) identical | max abs tensor diff | metrics identical | "
          "max abs metric diff | other outputs identical | differences (first 4) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        notes = "; ".join((r["tensor_diffs"] + r["metric_diffs"] + r["file_diffs"])[:4])
        print(f"| {r['case']} | {yes[r['identical']]} | {yes[not r['tensor_diffs']]} ({r['tensors']}) | "
              f"{r['tensor_max']:.3g} | {yes[not r['metric_diffs']]} | {r['metric_max']:.3g} | "
              f"{yes[not r['file_diffs']]} | {notes.replace('|', '/')} |")
    print()
    for r in rows:
        for label, runs in (("before", args.before), ("after", args.after)):
            cmd = runs / f"{r['case']}.cmd"
            print(f"- {r['case']} ({label}): `{cmd.read_text().strip() if cmd.exists() else '?'}`")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1, default=str))
    if args.rows:
        args.rows.write_text(json.dumps({"rows": [table_row(r) for r in rows]}, indent=1) + "\n")
    return 0 if all(r["identical"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
