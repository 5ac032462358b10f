"""A compress run's compressed-tensors export reloaded in plain transformers: logits against the run's in-memory
weights, and the reload's own perplexity (issue 40, item 5: "both exports served").

Benchmark script, not a test. RUN is an `iclrkit compress ...` output (its packed/ and the dense fake-quant model/,
which holds the in-memory weights as floats); CT is `iclrkit export compressed-tensors RUN --out CT`. The reference
is RUN/model (the in-memory compressed model); the reload is `AutoModelForCausalLM.from_pretrained(CT)` (transformers
+ the compressed-tensors package, nothing from iclrkit). Reports the largest |logit difference| (absolute and relative
to the largest |logit|) and the top-1 agreement over the first --logit-windows evaluation windows, and the
perplexity of the reload on the same windows as the run's own (BOS first where the tokenizer adds one).

    OMP_NUM_THREADS=1 nice python examples/models/ct_reload.py --run runs/gemma/w4a16/gptq \
        --ct runs/gemma/w4a16/gptq-ct --data $ICLRKIT_DATA/wikitext-2/test.txt --max-length 512 --windows 16
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import resource
import subprocess
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", required=True)
    parser.add_argument("--ct", required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--max-length", type=int, default=512)
    parser.add_argument("--windows", type=int, default=16)
    parser.add_argument("--logit-windows", type=int, default=2)
    parser.add_argument("--out", help="JSON report (default: CT/reload_check.json)")
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from toolkit.data.text import load_text, tokenize
    from toolkit.eval.perplexity import perplexity, window_plan, with_bos
    from toolkit.models.tokens import bos_id

    started = time.perf_counter()
    run = Path(args.run)
    record = json.loads((run / "run.json").read_text())
    tokenizer = AutoTokenizer.from_pretrained(args.ct)
    ids = tokenize(tokenizer, load_text(args.data))
    bos = bos_id(tokenizer)
    reference = AutoModelForCausalLM.from_pretrained(run / "model", dtype=torch.float32).eval()
    reloaded = AutoModelForCausalLM.from_pretrained(args.ct, dtype=torch.float32).eval()
    worst_abs = worst_rel = 0.0
    agree = total = 0
    with torch.no_grad():
        for begin, end, _ in window_plan(ids, args.max_length, None, args.logit_windows, bos is not None):
            window = with_bos(ids[begin:end], bos)[None]
            ref, got = reference(window).logits, reloaded(window).logits
            diff = float((got - ref).abs().max())
            worst_abs, worst_rel = max(worst_abs, diff), max(worst_rel, diff / float(ref.abs().max()))
            agree += int((got.argmax(-1) == ref.argmax(-1)).sum())
            total += ref.shape[1]
        del reference
        result = perplexity(reloaded, ids, max_length=args.max_length, device="cpu", max_windows=args.windows,
                            bos=bos)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    report = {"run": str(run), "ct": str(args.ct), "in_memory_ppl": record["metrics"].get("ppl"),
              "reload_ppl": round(result["ppl"], 4), "reload_tokens": result["tokens"],
              "max_abs_logit_diff": worst_abs, "max_relative_logit_diff": worst_rel,
              "top1_agreement": round(agree / total, 6), "logit_positions": total,
              "quantization_config": json.loads((Path(args.ct) / "config.json").read_text())
              .get("quantization_config", {}).get("format"),
              "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 1), "date": dt.date.today().isoformat(),
              "commit": subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], capture_output=True,
                                       text=True).stdout.strip(),
              "wall_seconds": round(time.perf_counter() - started, 1)}
    print(json.dumps(report, indent=2))
    out = Path(args.out) if args.out else Path(args.ct) / "reload_check.json"
    out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
