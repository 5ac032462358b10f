"""Gather gptq_side_by_side.sh's run.json files into results.json rows and print a Markdown table.

Row fields: model, setting, method ("GPTQ", "llm-compressor GPTQ", "SparseGPT -> GPTQ two-stage (ours)",
"llm-compressor SparseGPT -> GPTQ two-stage"), rotate, group_size, actorder, threads, seconds, ppl, seed, sparsity.
Usage: collect_gptq.py OUT_DIR THREADS [COMMITTED.json]
With COMMITTED.json (examples/obr/results.json), the rows are merged into it: rows with the same model, setting,
method, rotate, group_size and actorder are replaced, every other row is kept.
"""

import json
import sys
from pathlib import Path

METHODS = {"ours": "GPTQ", "oursk": "GPTQ", "ours1": "GPTQ", "ours0": "GPTQ", "obr": "OBR_GPTQ", "peer": "llm-compressor GPTQ", "ours2": "SparseGPT -> GPTQ two-stage (ours)",
           "peer2": "llm-compressor SparseGPT -> GPTQ two-stage"}


def rows(out: Path, threads: int) -> list[dict]:
    found = []
    dense = out / "dense" / "run.json"
    if dense.is_file():
        metrics = json.loads(dense.read_text())["metrics"]
        found.append({"model": "smollm2-135m", "setting": "fp16", "method": "FP dense", "rotate": False,
                      "group_size": None, "actorder": None, "threads": threads, "seconds": 0.0,
                      "ppl": round(metrics["ppl"], 3), "seed": 0, "sparsity": 0.0})
    for record_path in sorted(out.glob("*-r*-g*-*/run.json")):
        who, rot, group, order = record_path.parent.name.split("-")
        record = json.loads(record_path.read_text())
        metrics = record["metrics"]
        found.append({"model": "smollm2-135m", "setting": "w4a16-s50" if who.endswith("2") or who == "obr" else "w4a16",
                      "method": METHODS[who], "rotate": rot == "r1",
                      "group_size": None if group == "gnone" else int(group[1:]), "actorder": order,
                      "threads": metrics.get("threads", threads), "seconds": round(metrics["compress_seconds"], 1),
                      # CPU seconds of the compression phase (process_time): comparable on a shared machine
                      "cpu_seconds": metrics.get("compress_cpu_seconds"),
                      "ppl": round(metrics["ppl"], 3), "seed": record.get("seed", 0),
                      "sparsity": metrics.get("sparsity"),
                      # the residual rotation's construction ("exact" Hadamard or "kron-orthogonal") and seed
                      "rotation_kind": (metrics.get("hadamard") or {}).get("residual"),
                      "rotation_seed": record.get("config", {}).get("rotation_seed", 0) if rot == "r1" else None,
                      "w_clip": metrics.get("w_clip"), "w_range": metrics.get("w_range"),
                      "w_clip_search": record.get("config", {}).get("w_clip_search", "full")
                      if metrics.get("w_clip") else None,
                      "true_sequential": record.get("config", {}).get("true_sequential", who != "ours1")
                      if not who.startswith("peer") else False,
                      # fused: one batched forward per block, each group compressed as its input arrives
                      # (true-sequential inputs); per-group: a stopped forward per group; one-pass: one forward
                      # for all groups, then a propagation forward (llm-compressor's schedule)
                      "calibration": "one-pass" if who.startswith("peer") else metrics.get(
                          "calibration", "one-pass" if who == "ours1" else "per-group")})
    return found


KEY = ("model", "setting", "method", "rotate", "group_size", "actorder", "true_sequential", "calibration",
       "rotation_kind", "rotation_seed", "w_clip_search")


def merge(committed: Path, found: list[dict]) -> None:
    existing = json.loads(committed.read_text())["rows"] if committed.is_file() else []
    new_keys = {tuple(r.get(k) for k in KEY) for r in found}
    kept = [r for r in existing if tuple(r.get(k) for k in KEY) not in new_keys]
    committed.write_text(json.dumps({"rows": kept + found}, indent=2) + "\n")


def main(out: Path, threads: int, committed: Path | None = None) -> None:
    found = rows(out, threads)
    (out / "results.json").write_text(json.dumps({"rows": found}, indent=2))
    if committed is not None:
        merge(committed, found)
    print("| setting | method | rotate | group | actorder | calibration | ppl | seconds | CPU s | sparsity |")
    print("|---|---|---|---|---|---|---:|---:|---:|---:|")  # rotate: "yes (kind, seed)" on rotated rows
    for r in found:
        group = r["group_size"] or "channel"
        rotated = f"yes ({r.get('rotation_kind')}, {r.get('rotation_seed')})" if r["rotate"] else "no"
        if r.get("w_clip_search") == "coarse":
            rotated += ", coarse clip"
        schedule = r.get("calibration") or {True: "per-group", False: "one-pass"}.get(r.get("true_sequential"), "-")
        print(f"| {r['setting']} | {r['method']} | {rotated} | {group} | {r['actorder']} | "
              f"{schedule} | {r['ppl']:.2f} | {r['seconds']:.1f} | {r.get('cpu_seconds') or '-'} | {r['sparsity']} |")


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 1,
         Path(sys.argv[3]) if len(sys.argv) > 3 else None)
