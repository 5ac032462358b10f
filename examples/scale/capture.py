"""Capture OBR's per-linear problems (issue 42): run `compress obr` through the real pipeline with
`toolkit.compress.obr.obr_quantize` wrapped, and save the inputs of the chosen blocks' linears (W, damped H, mask,
scales) to one torch file per linear, so that solvers can be compared offline on the very same layers.

    python examples/scale/capture.py --model zoo:smollm2-135m --data ../shared/data/wikitext-2/valid.txt \
        --blocks 0,1,14,29 --rotate --nsamples 16 --seqlen 256 --out runs/obr-problems/smollm2
    python examples/scale/capture.py --model runs/scale/1.1B-2block --blocks 0,1 --out runs/obr-problems/1.1B

The run stops (and the script exits) after the last chosen block: nothing is exported. The linears are compressed
with the configured solver so later blocks see the inputs a real run gives them.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


class Captured(Exception):
    """Raised once every chosen block has been captured (stops the run early)."""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--data", default="embedded")
    parser.add_argument("--blocks", default="0,1", help="comma-separated block indices to capture")
    parser.add_argument("--nsamples", type=int, default=8)
    parser.add_argument("--seqlen", type=int, default=512)
    parser.add_argument("--w-bits", type=int, default=4)
    parser.add_argument("--sparsity", type=float, default=0.5)
    parser.add_argument("--nm", default=None)
    parser.add_argument("--rotate", action="store_true", help="QuaRot rotation (the seeds runs); off: as the scale bench")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--fast", action="store_true",
                        help="compress each linear by mask + RTN instead of OBR (the inputs of later blocks are "
                             "then those of an RTN-compressed model; for cost studies on random weights)")
    parser.add_argument("--linears-per-block", type=int, default=7, help="7 for Llama blocks (q k v o gate up down)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    import toolkit.compress.obr as obr_module
    from toolkit.compress.config import ObrConfig
    from toolkit.compress.quant import quantize_rows
    from toolkit.compress.recipe import run_compress
    from toolkit.core.context import RunContext

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    wanted = sorted(int(b) for b in args.blocks.split(","))
    original = obr_module.obr_quantize
    state = {"call": 0, "per_block": None, "index": []}

    config = ObrConfig(model=args.model, data=args.data, nsamples=args.nsamples, seqlen=args.seqlen,
                       w_bits=args.w_bits, a_bits=16, kv_bits=16, sparsity=args.sparsity, nm=args.nm,
                       rotate=args.rotate, export="none", onload=not args.rotate)

    def wrapped(W, hessian, keep, scale, bits, alpha, mode, blocksize=128, solver="cg", **options):
        per_block = state["per_block"]
        block = state["call"] // per_block
        if block > wanted[-1]:
            raise Captured
        position = state["call"] % per_block
        state["call"] += 1
        started = time.process_time()
        if args.fast:  # mask + round-to-nearest instead of OBR: later blocks' inputs are then approximate
            result = quantize_rows(W.to(hessian.H.dtype) * keep, scale, bits) * keep
        else:
            result = original(W, hessian, keep, scale, bits, alpha, mode, blocksize, solver, **options)
        seconds = time.process_time() - started
        if block in wanted:
            name = f"b{block:02d}-l{position}-{W.shape[0]}x{W.shape[1]}"
            torch.save({"W": W, "H": hessian.H, "dead": hessian.dead, "damp": hessian.damp, "keep": keep,
                        "scale": scale, "bits": bits, "alpha": alpha, "mode": mode, "blocksize": blocksize,
                        "block": block, "position": position, "model": args.model, "rotate": args.rotate,
                        "tokens": args.nsamples * args.seqlen, "solver_at_capture": "mask+rtn" if args.fast else solver,
                        "seconds_at_capture": seconds}, out / f"{name}.pt")
            state["index"].append(name)
            print(f"captured {name} ({seconds:.1f} CPU s with {solver})", flush=True)
        return result

    obr_module.obr_quantize = wrapped
    state["per_block"] = args.linears_per_block
    ctx = RunContext(out=out / "run", quiet=True, seed=args.seed)
    try:
        run_compress(config, ctx)
    except Captured:
        pass
    (out / "index.json").write_text(json.dumps({"problems": state["index"], "config": vars(args)}, indent=2))


if __name__ == "__main__":
    main()
