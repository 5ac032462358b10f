"""Gather the run.json files of repro.sh/demo.sh into results.json and print the table."""

import json
import sys
from pathlib import Path

METHODS = {"dense": "FP dense", "rtn-magnitude": "RTN+magnitude", "rtn": "RTN", "wanda-rtn": "Wanda+RTN",
           "sparsegpt-gptq": "SparseGPT+GPTQ", "sparsegpt-two-stage": "SparseGPT->GPTQ two-stage", "gptq": "GPTQ", "obr-rtn": "OBR_RTN", "obr-gptq": "OBR_GPTQ",
           "nf4-bnb": "bitsandbytes-NF4", "llmcompressor-sparsegpt+gptq": "llmcompressor-sparsegpt+gptq",
           "llmcompressor-gptq": "llmcompressor-gptq"}


def main(out: Path) -> None:
    rows = []
    for record_path in sorted(out.glob("*/**/run.json")):
        record = json.loads(record_path.read_text())
        metrics = record["metrics"]
        parts = record_path.parent.relative_to(out).parts
        model, method = parts[0], METHODS.get(parts[-1], parts[-1])
        setting = parts[1].replace("-2-4", "-2:4") if len(parts) == 3 else "fp16"
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
    (out / "results.json").write_text(json.dumps({"rows": rows}, indent=2))
    print(f"{'model':<14} {'setting':<13} {'method':<16} {'ppl':>9} {'size_mb':>8} {'seconds':>8}")
    for r in rows:
        size = f"{r['size_mb']:.2f}" if r["size_mb"] is not None else "-"
        print(f"{r['model']:<14} {r['setting']:<13} {r['method']:<16} {r['ppl']:>9.2f} {size:>8} {r['seconds']:>8.1f}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
