"""One OBR block at a real shape, measured against the plan (issue 42): `make gpu-check` runs it on a 7B-shaped
block the first time a GPU is lent; `--device cpu --shape tiny` is its CPU smoke (tests/unit/test_obr_block_check.py).

    python scripts/obr_block_check.py --device cuda --shape 7B --out DIR [--nsamples 16 --seqlen 2048]

Writes a 1-block Llama of the shape (toolkit.models.synthetic: N(0, 0.02) weights from a fixed seed, bf16) unless
--model-dir already holds it, then compresses it twice in this process, `compress gptq` and `compress obr`
(W4A16 + 50 % unstructured, unrotated, per-block onloading, the embedded calibration text), and records in
DIR/obr_block.json: seconds per block of each (wall; on CUDA the solver clock synchronises), per linear the OBR
solves' iterations, seconds in the products with H vs the preconditioner vs set-up, the residual and the estimated
loss excess; and examples/scale/gpu_plan.py's projection for the same shape, tokens and the measured iterations,
with measured / projected. The plan is checked, not asserted: the exit status is 0 when both runs completed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples" / "scale"))


def write_model(path: Path, shape: str) -> dict:
    from toolkit.data.text import embedded_text
    from toolkit.models.synthetic import llama_config, write_random_model
    from toolkit.zoo.lm import train_tokenizer

    config = llama_config(shape, 1)
    marker = path / "random_model.json"
    if marker.is_file() and json.loads(marker.read_text()).get("config") == config:
        return json.loads(marker.read_text())
    written = write_random_model(path, config, 0, train_tokenizer(embedded_text()[:400_000], vocab_size=2000))
    info = {"config": config, "seed": 0, **written}
    marker.write_text(json.dumps(info, indent=2))
    return info


def compress(model: str, method: str, device: str, nsamples: int, seqlen: int, out: Path) -> tuple[dict, list]:
    """Run `compress <method>` in this process; returns (metrics, per-linear OBR solve records)."""
    import toolkit.compress.obr as obr_module
    from toolkit.compress.config import GptqConfig, ObrConfig
    from toolkit.compress.recipe import run_compress
    from toolkit.core.context import RunContext

    records: list = []
    original = obr_module.obr_quantize

    def recorded(W, hessian, keep, *args, **kwargs):
        stats: list = []
        started = time.perf_counter()
        result = original(W, hessian, keep, *args, stats=stats, **kwargs)
        records.append({"shape": list(W.shape), "seconds": round(time.perf_counter() - started, 3),
                        "solves": [s.as_dict() for s in stats]})
        return result

    cls = GptqConfig if method == "gptq" else ObrConfig
    config = cls(model=model, data="embedded", nsamples=nsamples, seqlen=seqlen, w_bits=4, a_bits=16, kv_bits=16,
                 sparsity=0.5, rotate=False, export="none", onload=True)
    obr_module.obr_quantize = recorded
    try:
        ctx = RunContext(out=out / method, quiet=True, device=device)
        started = time.perf_counter()
        metrics = dict(run_compress(config, ctx))
        metrics["wall_s"] = round(time.perf_counter() - started, 2)
    finally:
        obr_module.obr_quantize = original
    return metrics, records


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", required=True, help="cuda | cuda:N | cpu")
    parser.add_argument("--shape", default="7B", help="a toolkit.models.synthetic shape (7B, 1.1B, 135M, tiny)")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--model-dir", type=Path, default=None, help="default OUT/model-<shape>-1block")
    parser.add_argument("--nsamples", type=int, default=16)
    parser.add_argument("--seqlen", type=int, default=2048)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    import gpu_plan
    import torch

    model_dir = args.model_dir or args.out / f"model-{args.shape}-1block"
    info = write_model(model_dir, args.shape)
    record: dict = {"device": args.device, "shape": args.shape, "model": str(model_dir), "nsamples": args.nsamples,
                    "seqlen": args.seqlen, "torch": torch.__version__,
                    "gpu": torch.cuda.get_device_name() if args.device.startswith("cuda") else None,
                    "command": " ".join(["python", "scripts/obr_block_check.py", *(argv or sys.argv[1:])])}
    (args.out / "obr_block.json").write_text(json.dumps(dict(record, status="running or killed"), indent=2))
    runs = {}
    for method in ("gptq", "obr"):
        metrics, records = compress(str(model_dir), method, args.device, args.nsamples, args.seqlen, args.out)
        runs[method] = {"seconds_per_block": metrics.get("seconds_per_block"), "wall_s": metrics["wall_s"],
                        "compress_seconds": metrics.get("compress_seconds"), "sparsity": metrics.get("sparsity")}
        if method == "obr":
            runs[method]["linears"] = records
    solves = [s for r in runs["obr"]["linears"] for s in r["solves"]]
    iterations = (max(s["iterations"] for s in solves[0::2]), max(s["iterations"] for s in solves[1::2]))
    shape = gpu_plan.shape_of_config(info["config"])
    projection = gpu_plan.project(args.shape, shape, iterations, tokens=args.nsamples * args.seqlen)
    measured = {m: (runs[m]["seconds_per_block"] or [None])[0] for m in runs}
    record.update(runs=runs, iterations=list(iterations), projection=projection, measured_s_per_block=measured,
                  obr_over_gptq=round(measured["obr"] / measured["gptq"], 2) if measured["gptq"] else None,
                  measured_over_projected={m: round(measured[m] / projection[f"{m}_s_per_block"], 2)
                                           if measured[m] and projection[f"{m}_s_per_block"] else None
                                           for m in ("gptq", "obr")},
                  product_seconds=round(sum(s["product_seconds"] for s in solves), 3),
                  solve_seconds=round(sum(s["seconds"] for s in solves), 3), status="done")
    (args.out / "obr_block.json").write_text(json.dumps(record, indent=2))
    print(json.dumps({k: record[k] for k in ("shape", "device", "iterations", "measured_s_per_block",
                                               "obr_over_gptq", "measured_over_projected")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
