"""Does llama.cpp serve iclrkit's GGUF export? Greedy continuations of 5 prompts, llama.cpp vs the in-memory model.

Benchmark script, not a test: it needs llama-cpp-python, which compiles llama.cpp from source, in its own venv so
the core install stays free of it:

    python3 -m venv .venv-llamacpp && .venv-llamacpp/bin/pip install llama-cpp-python
    .venv/bin/python examples/obr/llamacpp_check.py --run runs/obr-w4a16-s50          # a compress run (packed/)
    .venv/bin/python examples/obr/llamacpp_check.py                                   # makes an RTN W4A16 s50 run

Steps: export RUN/packed to GGUF Q4_0 (toolkit.export.gguf); greedy-decode each prompt's token ids with
(a) the in-memory fake-quant model `load_packed` rebuilds (what iclrkit evaluates), (b) the same model with every
row scale rounded to fp16 (exactly the GGUF weights), (c) llama.cpp on the .gguf file, fed the same prompt token ids
(no re-tokenisation), temperature 0. Reports, per prompt, the tokens llama.cpp agrees on before the first
difference. llama.cpp's CPU path quantizes activations to 8 bits for Q4_0 dot products, so late divergence on
near-tied logits is expected; the figure is what it is. `check_run(run, work, ...)` returns the report for one run
(examples/obr/serve_check.py calls it for each run of a repro setting).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_PYTHON = str(ROOT / ".venv-llamacpp" / "bin" / "python")
PROMPTS = ["The capital of France is", "Once upon a time, there was a", "The best way to learn programming is",
           "Water boils at a temperature of", "In 1969, the first man to walk on the moon was"]
LLAMACPP = """
import json, sys
from llama_cpp import Llama
spec = json.loads(sys.stdin.read())
llm = Llama(model_path=spec["gguf"], n_ctx=512, n_threads=spec["threads"], logits_all=False, verbose=False)
out = []
for ids in spec["prompts"]:
    llm.reset()
    tokens = []
    for token in llm.generate(ids, temp=0.0, top_k=1, top_p=1.0, repeat_penalty=1.0, reset=True):
        if len(tokens) == spec["new_tokens"]:
            break
        tokens.append(int(token))
    out.append(tokens)
print(json.dumps(out))
"""


def _make_run(model: str, data: str, out: Path) -> Path:
    command = [str(ROOT / ".venv" / "bin" / "iclrkit"), "compress", "rtn", "--model", model, "--data", data,
               "--w-bits", "4", "--a-bits", "16", "--kv-bits", "16", "--sparsity", "0.5", "--nsamples", "8",
               "--seqlen", "256", "--set", "export=packed", "--out", str(out)]
    subprocess.run(["nice", "-n", "10", *command], check=True)
    return out


def _greedy(model, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    """Greedy continuation token ids (transformers generate, KV cache on, no sampling)."""
    import torch

    outputs = []
    with torch.no_grad():
        for ids in prompts:
            sequence = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                      max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                                      pad_token_id=0)
            outputs.append([int(t) for t in sequence[0, len(ids):]])
    return outputs


def _log(message: str, started: float) -> None:
    import time

    print(f"[{time.perf_counter() - started:7.1f}s] {message}", file=sys.stderr, flush=True)


def compressed_tensors_reload(q, model, prompts: list[list[int]], out: Path) -> dict:
    """Export to compressed-tensors, reload with transformers, compare logits with the in-memory model: the largest
    |logit difference| over every position of every prompt, absolute and relative to that prompt's max |logit|."""
    import torch

    try:
        import compressed_tensors  # noqa: F401 - needed by transformers' loader
    except ImportError:
        return {"skipped": "compressed-tensors is not installed"}
    from transformers import AutoModelForCausalLM

    from toolkit.core.errors import BadInputError
    from toolkit.export.compressed_tensors import save_compressed_tensors

    try:
        save_compressed_tensors(q, out)
    except BadInputError as exc:
        return {"skipped": exc.message}
    reloaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    worst_abs = worst_rel = 0.0
    with torch.no_grad():
        for ids in prompts:
            ref = model(torch.tensor([ids])).logits
            got = reloaded(torch.tensor([ids])).logits
            diff = float((got - ref).abs().max())
            worst_abs, worst_rel = max(worst_abs, diff), max(worst_rel, diff / float(ref.abs().max()))
    return {"max_abs_logit_diff": worst_abs, "max_relative_logit_diff": worst_rel, "prompts": len(prompts)}


def leading_agreement(a: list[list[int]], b: list[list[int]]) -> list[int]:
    """Per prompt: how many leading tokens match."""
    counts = []
    for x, y in zip(a, b):
        n = 0
        while n < min(len(x), len(y)) and x[n] == y[n]:
            n += 1
        counts.append(n)
    return counts


def llamacpp_continuations(gguf: Path, prompts: list[list[int]], new_tokens: int, python: str,
                           threads: int) -> list[list[int]]:
    """Greedy continuations of `prompts` (token ids) by llama.cpp, in the llama-cpp-python venv `python`."""
    if not Path(python).is_file():
        raise RuntimeError(f"no llama-cpp-python interpreter at {python} (python3 -m venv .venv-llamacpp && "
                           ".venv-llamacpp/bin/pip install llama-cpp-python)")
    spec = {"gguf": str(gguf), "prompts": prompts, "new_tokens": new_tokens, "threads": threads}
    done = subprocess.run([python, "-c", LLAMACPP], input=json.dumps(spec), capture_output=True, text=True)
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        raise RuntimeError(f"llama.cpp run failed: {lines[-1] if lines else '?'}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def check_run(run: str | Path, work: Path, new_tokens: int = 16, python: str = DEFAULT_PYTHON, threads: int = 2,
              with_ct: bool = False, started: float | None = None) -> dict:
    """The agreement report of one compress run (or packed/ dir): GGUF Q4_0 export under `work`, llama.cpp vs the
    in-memory model (and vs the model with fp16 row scales), optionally the compressed-tensors reload check.
    Raises BadInputError for a model the exporters refuse, RuntimeError when llama.cpp cannot run."""
    import time

    import torch

    from toolkit.compress.packed import load_packed
    from toolkit.export.gguf import save_gguf
    from toolkit.export.quantized import from_packed
    from toolkit.export.run import provenance, resolve_packed

    started = time.perf_counter() if started is None else started
    work = Path(work)
    packed, record = resolve_packed(run)
    q = from_packed(packed, provenance(record))
    summary = save_gguf(q, work / "gguf")
    gguf_path = work / "gguf" / summary["file"]
    _log(f"exported {gguf_path} ({summary['size_mb']} MB)", started)
    tokenizer = q.tokenizer
    prompts = [tokenizer(p)["input_ids"] for p in PROMPTS]
    served = llamacpp_continuations(gguf_path, prompts, new_tokens, python, threads)
    _log("llama.cpp continuations done", started)
    model, _ = load_packed(packed, with_tokenizer=False)
    reference = _greedy(model, prompts, new_tokens)
    _log("in-memory continuations done", started)
    with torch.no_grad():
        for path, grid in q.linears.items():
            module = model.get_submodule(path)
            if getattr(module, "iclrkit_online_rotation", None) is None:  # GGUF keeps rotated down_proj float
                module.weight.copy_(grid.codes.float() * grid.scales.half().float())
    fp16_scales = _greedy(model, prompts, new_tokens)
    _log("fp16-scale continuations done", started)
    del model
    ct_check = compressed_tensors_reload(q, q.model, prompts, work / "ct") if with_ct else {"skipped": "off"}
    _log("compressed-tensors check done", started)
    vs_memory, vs_fp16 = leading_agreement(served, reference), leading_agreement(served, fp16_scales)
    total = len(PROMPTS) * new_tokens
    return {"packed": str(packed), "gguf": str(gguf_path), "gguf_mb": summary["size_mb"],
            "compressed_tensors_reload": ct_check,
            "new_tokens": new_tokens, "prompts": PROMPTS,
            "llamacpp_vs_in_memory_leading_tokens": vs_memory,
            "llamacpp_vs_fp16_scales_leading_tokens": vs_fp16,
            "fp16_scales_vs_in_memory_leading_tokens": leading_agreement(fp16_scales, reference),
            "exact_prompts_vs_in_memory": sum(n == new_tokens for n in vs_memory),
            "token_agreement_vs_in_memory": round(sum(vs_memory) / total, 4),
            "token_agreement_vs_fp16_scales": round(sum(vs_fp16) / total, 4),
            "texts": {"in_memory": [tokenizer.decode(t) for t in reference],
                      "llamacpp": [tokenizer.decode(t) for t in served]}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", help="compress run dir (with packed/) or a packed/ dir; default: make RTN W4A16")
    parser.add_argument("--model", default="zoo:smollm2-135m")
    parser.add_argument("--data", default=os.environ.get("ICLRKIT_DATA", str(ROOT.parent / "shared" / "data"))
                        + "/wikitext-2/valid.txt")
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--with-ct", action="store_true", help="also reload a compressed-tensors export")
    parser.add_argument("--python", default=DEFAULT_PYTHON)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", help="write the JSON report here too")
    args = parser.parse_args()

    import time

    import torch

    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="iclrkit-llamacpp-"))
    run = Path(args.run) if args.run else _make_run(args.model, args.data, work / "run")
    try:
        report = check_run(run, work, args.new_tokens, args.python, args.threads, args.with_ct, started)
    except RuntimeError as exc:
        sys.exit(str(exc))
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
