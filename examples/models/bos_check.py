"""Perplexity with and without BOS on the same text windows (issue 40: "Perplexity and calibration never add BOS").

Benchmark script, not a test. Scores the first --windows windows of --max-length tokens of a text twice with
toolkit.eval.perplexity: once as `iclrkit eval ppl` does now (BOS first where the tokenizer adds one; each window
holds BOS + max_length - 1 text tokens, every text token scored) and once without BOS, as it did before (the same
max_length - 1 text tokens per window, the first of each window unscored). The text windows are the same token spans;
the no-BOS pass scores one token fewer per window. Prints and writes JSON.

    OMP_NUM_THREADS=1 nice python examples/models/bos_check.py --model zoo:gemma3-270m \
        --data $ICLRKIT_DATA/wikitext-2/test.txt --max-length 512 --windows 16 --out runs/gemma/bos_check.json
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--max-length", type=int, default=512)
    parser.add_argument("--windows", type=int, default=16)
    parser.add_argument("--out")
    args = parser.parse_args()

    import torch

    from toolkit.data.text import load_text, tokenize
    from toolkit.eval.perplexity import perplexity
    from toolkit.models.source import load_model
    from toolkit.models.tokens import bos_id

    started = time.perf_counter()
    model, tokenizer = load_model(args.model, "cpu", None)
    model.eval()
    ids = tokenize(tokenizer, load_text(args.data))
    bos = bos_id(tokenizer)
    report = {"model": args.model, "data": Path(args.data).name, "max_length": args.max_length,
              "windows": args.windows, "bos_id": bos}
    with torch.no_grad():
        for name, token, length in (("with_bos", bos, args.max_length), ("without_bos", None, args.max_length - 1)):
            result = perplexity(model, ids, max_length=length, device="cpu", max_windows=args.windows, bos=token)
            report[name] = {"ppl": round(result["ppl"], 3), "tokens": result["tokens"]}
    usage = resource.getrusage(resource.RUSAGE_SELF)
    report["cpu_seconds"] = round(usage.ru_utime + usage.ru_stime, 1)
    report["wall_seconds"] = round(time.perf_counter() - started, 1)
    print(json.dumps(report, indent=2))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
