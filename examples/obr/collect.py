"""Gather the run.json files of repro.sh/demo.sh into results.json and print the table.

When OUT/serve_check.json exists (examples/obr/serve_check.py: llama.cpp agreement, compressed-tensors reload,
zero-shot accuracies), its columns are merged into the rows with the same (model, setting, method) and printed
as a second table; the rows and keys collect writes without it are unchanged.
"""

import json
import sys
from pathlib import Path

METHODS = {"dense": "FP dense", "rtn-magnitude": "RTN+magnitude", "rtn": "RTN", "wanda-rtn": "Wanda+RTN",
           "sparsegpt-gptq": "SparseGPT+GPTQ", "sparsegpt-two-stage": "SparseGPT->GPTQ two-stage", "gptq": "GPTQ", "obr-rtn": "OBR_RTN", "obr-gptq": "OBR_GPTQ",
           "nf4-bnb": "bitsandbytes-NF4", "llmcompressor-sparsegpt+gptq": "llmcompressor-sparsegpt+gptq",
           "llmcompressor-gptq": "llmcompressor-gptq"}
SERVE_CHECK = "serve_check.json"
KEY = ("model", "setting", "method")


def row_key(parts: tuple[str, ...]) -> tuple[str, str, str]:
    """(model, setting, method) of a run directory OUT/<model>/<setting>/<method> or OUT/<model>/dense."""
    model, method = parts[0], METHODS.get(parts[-1], parts[-1])
    setting = parts[1].replace("-2-4", "-2:4") if len(parts) == 3 else "fp16"
    return model, setting, method


def merge_serve_check(rows: list[dict], serve_rows: list[dict]) -> list[dict]:
    """Add each serve-check row's columns to the results row with its (model, setting, method), in place; returns
    the serve-check rows that matched no results row. Keys a results row already has are not overwritten."""
    index = {tuple(row[k] for k in KEY): row for row in rows}
    unmatched = []
    for serve in serve_rows:
        target = index.get(tuple(serve.get(k) for k in KEY))
        if target is None:
            unmatched.append(serve)
            continue
        for key, value in serve.items():
            target.setdefault(key, value)
    return unmatched


def _fmt(value, spec: str) -> str:
    return format(value, spec) if isinstance(value, (int, float)) else "-"


def print_serve_table(rows: list[dict], serve_rows: list[dict]) -> None:
    tasks = sorted({key[:-len("_acc")] for serve in serve_rows for key in serve if key.endswith("_acc")})
    merged = [row for row in rows if any(tuple(row[k] for k in KEY) == tuple(s.get(k) for k in KEY)
                                         for s in serve_rows)]
    header = f"{'model':<14} {'setting':<13} {'method':<26} {'llama.cpp':>9} {'ct max|dl|':>10}"
    print("\n" + header + "".join(f" {task + ' acc':>22}" for task in tasks))
    for r in merged:
        line = (f"{r['model']:<14} {r['setting']:<13} {r['method']:<26} {_fmt(r.get('llamacpp_agreement'), '.3f'):>9}"
                f" {_fmt(r.get('ct_reload_max_abs_diff'), '.2e'):>10}")
        for task in tasks:
            acc, err = r.get(f"{task}_acc"), r.get(f"{task}_acc_stderr")
            line += f" {_fmt(acc, '.3f') + ' +- ' + _fmt(err, '.3f'):>22}"
        print(line)


def main(out: Path) -> None:
    rows = []
    for record_path in sorted(out.glob("*/**/run.json")):
        record = json.loads(record_path.read_text())
        metrics = record["metrics"]
        model, setting, method = row_key(record_path.parent.relative_to(out).parts)
        dense = method == "FP dense"
        rows.append({"model": model, "setting": setting, "method": method, "ppl": round(metrics["ppl"], 3),
                     "seed": record.get("seed", 0),
                     "size_mb": metrics.get("packed_mb") if not dense else None,
                     "seconds": round(metrics.get("compress_seconds", 0.0), 1),
                     "sparsity": metrics.get("sparsity"),
                     "linear_size_ratio_vs_fp16": metrics.get("packed_linear_ratio_vs_fp16"),
                     "size_ratio_vs_fp16": metrics.get("packed_ratio_vs_fp16")})
    fp16 = {r["model"]: None for r in rows}
    for record_path in sorted(out.glob("*/*/*/run.json")):
        metrics = json.loads(record_path.read_text())["metrics"]
        if metrics.get("fp16_mb") is not None:
            fp16[record_path.relative_to(out).parts[0]] = metrics["fp16_mb"]
    for row in rows:
        if row["method"] == "FP dense":
            row["size_mb"] = fp16.get(row["model"])
    order = list(METHODS.values())
    rows.sort(key=lambda r: (r["model"], r["setting"] != "fp16", r["setting"], order.index(r["method"])
                             if r["method"] in order else 99))
    serve_rows = []
    if (out / SERVE_CHECK).is_file():
        serve_rows = json.loads((out / SERVE_CHECK).read_text()).get("rows", [])
        for row in merge_serve_check(rows, serve_rows):
            print(f"{SERVE_CHECK}: no results row for {row.get('model')} {row.get('setting')} {row.get('method')}",
                  file=sys.stderr)
    (out / "results.json").write_text(json.dumps({"rows": rows}, indent=2))
    print(f"{'model':<14} {'setting':<13} {'method':<16} {'ppl':>9} {'size_mb':>8} {'seconds':>8}")
    for r in rows:
        size = f"{r['size_mb']:.2f}" if r["size_mb"] is not None else "-"
        print(f"{r['model']:<14} {r['setting']:<13} {r['method']:<16} {r['ppl']:>9.2f} {size:>8} {r['seconds']:>8.1f}")
    if serve_rows:
        print_serve_table(rows, serve_rows)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
