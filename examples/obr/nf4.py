"""Off-the-shelf reference row: bitsandbytes NF4 (block 64) on every block linear, weight-only, same perplexity
protocol as the compress runs. Usage: nf4.py MODEL EVAL_TEXT MAX_LENGTH WINDOWS OUT_DIR (writes OUT_DIR/run.json)."""

import json
import sys
import time
from pathlib import Path

import torch


def main(model_spec: str, eval_text: str, max_length: int, windows: int, out: Path) -> None:
    import bitsandbytes.functional as bnb

    from toolkit.data.text import load_text, tokenize
    from toolkit.eval.perplexity import perplexity
    from toolkit.models.source import load_model
    from toolkit.models.view import view_of

    torch.set_num_threads(min(2, torch.get_num_threads()))
    model, tokenizer = load_model(model_spec, "cpu", torch.float32)
    view = view_of(model)
    paths = view.quantized_inputs()
    started, stored = time.perf_counter(), 0
    for layer in view.blocks:
        for path in [s.module for s in view.layout(0).slots]:
            module = layer.get_submodule(path)
            packed, state = bnb.quantize_4bit(module.weight.data, blocksize=64, quant_type="nf4")
            module.weight.data = bnb.dequantize_4bit(packed, state).to(module.weight.dtype)
            stored += packed.numel() + state.absmax.numel() * state.absmax.element_size()
    seconds = time.perf_counter() - started
    others = sum(p.numel() * 2 for n, p in model.named_parameters()
                 if not any(n == f"{path}.weight" for path in paths))
    result = perplexity(model, tokenize(tokenizer, load_text(eval_text)), max_length=max_length,
                        max_windows=windows)
    out.mkdir(parents=True, exist_ok=True)
    (out / "run.json").write_text(json.dumps({"technique": "bitsandbytes-nf4", "metrics": {
        "ppl": result["ppl"], "packed_mb": round((stored + others) / 1e6, 3), "compress_seconds": seconds}}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), Path(sys.argv[5]))
