"""Does llama.cpp compute what iclrkit computes? GGUF Q4_0 exports of every architecture, logits compared.

Benchmark script, not a test: it needs llama-cpp-python (it compiles llama.cpp), in its own venv so the core install
stays free of it:

    python3 -m venv .venv-llamacpp
    CMAKE_ARGS="-DGGML_NATIVE=off" .venv-llamacpp/bin/pip install llama-cpp-python==0.3.36
    OMP_NUM_THREADS=1 nice .venv/bin/python examples/gguf/agreement.py            # every architecture + real models
    .venv/bin/python examples/gguf/agreement.py --archs qwen2 gemma2 --no-real    # a few

Per architecture of `toolkit.models.tiny.ARCHITECTURES` (tiny random models, seed 0, the architecture matrix's
tokenizer) and per real model (`--real`: zoo:smollm2-135m by default; any checkpoint directory, e.g. the zoo's Gemma 3 270M):
1. `iclrkit compress rtn --w-bits 4 --no-rotate --set export=gguf` (packed/ and gguf/ of the same run); an
   architecture the writer refuses is recorded with its one-line reason;
2. the reference: iclrkit's packed model (`--model RUN/packed`, what iclrkit evaluates), and the same model with
   every row scale rounded to fp16 (exactly the weights the GGUF file holds);
3. llama.cpp (llama-cpp-python, CPU, one thread) loads the .gguf and evaluates the same token ids (no re-tokenising):
   the logits at every position of each prompt, then a greedy continuation;
4. reported: max |logit difference| (absolute, and relative to the prompt's max |logit|), top-1 agreement at every
   prompt position, and the leading greedy tokens that agree.
llama.cpp's CPU kernels quantize activations to 8 bits for Q4_0 dot products and keep the KV cache in fp16, so the
logits differ at the 1e-3..1e-2 level even when the file is exact; a wrong layout shows up as O(1) differences and
lost top-1 agreement. Writes results.json and RESULTS.md; every record (the file's top level and each row) carries
its provenance from scripts/provenance.py: the command (a row: the iclrkit command of that model), the commit and
load when the run started, the date it was written, the seed (0: the tiny models' weights, the CLI's seed), this
script as `repro`.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _load_provenance():
    spec = importlib.util.spec_from_file_location("provenance", ROOT / "scripts" / "provenance.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


provenance = _load_provenance()
REPRO = "examples/gguf/agreement.py"
SEED = 0  # the tiny models' weights (torch.manual_seed(0), sharpen) and every compress run's --seed default
DEFAULT_PYTHON = str(ROOT / ".venv-llamacpp" / "bin" / "python")
REAL = ("zoo:smollm2-135m",)  # and any local checkpoint directory (--real DIR ...)
PROMPT_TEXTS = ["The history of the city begins in the early years of the century, when",
                "In mathematics, a function is a rule that assigns to each input",
                "The river flows through the valley and into the sea, where the",
                "After the war the company built new factories and hired workers"]
TOKENIZER_TEXTS = [*PROMPT_TEXTS, "In 1969, 12345 people paid $3.50 each.", "  two  spaces\nand a new line\n\n",
                   "Café, naïve, 東京 and emoji 🙂!", "don't won't it's", "x=f(y)+2*z; // code"]
LLAMACPP = r"""
import json, sys
import numpy as np
from llama_cpp import Llama
spec = json.loads(sys.stdin.read())
llm = Llama(model_path=spec["gguf"], n_ctx=spec["n_ctx"], n_batch=spec["n_ctx"], n_threads=1, logits_all=True,
            verbose=False, seed=0)
out = {"logits": [], "greedy": [], "vocab": llm.n_vocab(),
       "tokens": [llm.tokenize(t.encode("utf-8"), add_bos=True, special=False) for t in spec["texts"]]}
for i, ids in enumerate(spec["prompts"]):
    llm.reset()
    llm.eval(ids)
    logits = np.array(llm.scores[:llm.n_tokens], dtype=np.float32)
    np.save(f"{spec['work']}/llamacpp-{i}.npy", logits)
    tokens = []
    for _ in range(spec["new_tokens"]):
        token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        tokens.append(token)
        llm.eval([token])
    out["greedy"].append(tokens)
print(json.dumps(out))
"""


def _cli(*args) -> tuple[int, str, str]:
    from typer.testing import CliRunner

    from cli.main import app

    result = CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def _provenance(command: str, start: dict) -> dict:
    """A record's provenance as scripts/provenance.py writes it (command, commit + dirty of the code when the run
    started, date now, machine: cores, load at the start and now, and the platform; repro; seed)."""
    prov = provenance.current(command, REPRO, start["load"], seed=SEED, start_state=start["code"])
    prov["machine"]["platform"] = platform.machine()
    return prov


def _machine_text(machine) -> str:
    if isinstance(machine, dict):
        return f"{machine.get('platform', 'CPU')}, {machine['cores']} cores"
    return str(machine)  # rows written before provenance.py's format: "x86_64, 2 cores"


VARIANTS = {  # tiny configs as the real checkpoints of the architecture set them, where the tiny default differs
    "olmoe@mha": ("olmoe", {"num_key_value_heads": 4}),  # OLMoE-1B-7B: no grouped-query attention
    "qwen3_moe@norm_topk": ("qwen3_moe", {"norm_topk_prob": True}),  # Qwen3-MoE checkpoints renormalise top-k
}
# negative controls: a deliberate layout error (the q/k rows of Llama left in transformers' order), on the benchmark's
# weights and on transformers' default 0.02 init: what a wrong file looks like in this table
CONTROLS = {"llama!unpermuted-qk": ("llama", True), "llama@init-0.02!unpermuted-qk": ("llama", False)}


def sharpen(model) -> None:
    """Redraw the weights at the scale of a trained model (seeded): matrices N(0, 1/fan_in), token embeddings N(0, 1),
    norm scales 1 + N(0, 0.2²) (Gemma's (1 + w): w ~ N(0, 0.2²)), biases N(0, 0.1²). transformers' 0.02 init leaves
    attention near-uniform and logits ~0.5, where a wrong q/k row order or a missing norm offset would barely show."""
    import torch

    from toolkit.models.layout import is_norm
    from toolkit.models.norms import norm_info

    generator = torch.Generator().manual_seed(0)
    embed = model.get_input_embeddings().weight
    offsets = {n: norm_info(n, m).offset for n, m in model.named_modules() if is_norm(m) and
               getattr(m, "weight", None) is not None}
    with torch.no_grad():
        for name, param in model.named_parameters():
            module = name.rsplit(".", 1)[0]
            noise = torch.randn(param.shape, generator=generator)
            if param is embed:
                param.copy_(noise)
            elif param.dim() >= 2:
                fan_in = param.shape[0] if type(model.get_submodule(module)).__name__ == "Conv1D" else param.shape[-1]
                param.copy_(noise / fan_in ** 0.5)
            elif module in offsets and name.endswith("weight"):
                param.copy_(1.0 - offsets[module] + 0.2 * noise)
            else:
                param.copy_(0.1 * noise)


def _tiny_model(label: str, work: Path, tokenizer) -> Path:
    import torch

    from toolkit.models.tiny import build_tiny, tiny_config

    directory = work / "models" / label  # inputs in a folder of their own: outputs never go into an input's folder
    if not (directory / "config.json").exists():
        arch, overrides = VARIANTS.get(label, (label, {}))
        arch, drawn = CONTROLS.get(label, (arch, True))
        torch.manual_seed(0)
        model = build_tiny(arch, len(tokenizer))
        if overrides:
            import transformers

            config = tiny_config(arch, len(tokenizer))
            for key, value in overrides.items():
                setattr(config, key, value)
            model = transformers.AutoModelForCausalLM.from_config(config).eval()
        if drawn:
            sharpen(model)
        model.save_pretrained(directory)
        tokenizer.save_pretrained(directory)
    return directory


def _prompts(tokenizer, length: int) -> list[list[int]]:
    from toolkit.models.tokens import bos_id

    bos = bos_id(tokenizer)
    prompts = []
    for text in PROMPT_TEXTS:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"][:length - (bos is not None)]
        prompts.append(([bos] if bos is not None else []) + [int(i) for i in ids])
    return prompts


def _reference(packed: Path, prompts: list[list[int]], new_tokens: int, fp16_scales: bool):
    """(logits per prompt, greedy continuations) of iclrkit's packed model (fp16_scales: every row scale rounded to
    fp16, as the GGUF file stores them)."""
    import torch

    from toolkit.export.quantized import from_packed, load_packed_model
    from toolkit.models.view import view_of

    model, _ = load_packed_model(packed, with_tokenizer=False)
    if fp16_scales:
        q = from_packed(packed)
        view = view_of(model)
        with torch.no_grad():
            for path, grid in q.linears.items():
                block, slot = view.resolve(path)
                if slot.kind != "expert" and getattr(block.get_submodule(slot.module), "iclrkit_online_rotation",
                                                     None) is not None:
                    continue
                view.set_weight(path, _fp16_weight(grid))
    logits, greedy, margins = [], [], []  # margins: the reference's top-1 minus top-2 logit at each greedy step
    with torch.no_grad():
        for ids in prompts:
            logits.append(model(torch.tensor([ids])).logits[0].float().numpy())
            sequence, gaps = list(ids), []
            for _ in range(new_tokens):
                next_logits = model(torch.tensor([sequence])).logits[0, -1].float()
                top = next_logits.topk(2).values
                sequence.append(int(next_logits.argmax()))
                gaps.append(float(top[0] - top[1]))
            greedy.append(sequence[len(ids):])
            margins.append(gaps)
    return logits, greedy, margins


def _fp16_weight(grid):
    """codes × fp16(scale): the weight a Q4_0 block holds."""
    import torch

    scales = grid.scales.half().float()
    if grid.group_size is not None:
        scales = scales.repeat_interleave(grid.group_size, dim=1)[:, :grid.codes.shape[1]]
    return grid.codes.float() * scales.to(torch.float32)


def _llamacpp(gguf: Path, prompts: list[list[int]], new_tokens: int, python: str, work: Path, n_ctx: int):
    import numpy as np

    spec = {"gguf": str(gguf), "prompts": prompts, "new_tokens": new_tokens, "work": str(work), "n_ctx": n_ctx,
            "texts": TOKENIZER_TEXTS}
    done = subprocess.run([python, "-c", LLAMACPP], input=json.dumps(spec), capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    if done.returncode != 0:
        lines = [ln for ln in done.stderr.strip().splitlines() if ln.strip()]
        raise RuntimeError(" | ".join(lines[-3:]) if lines else f"exit {done.returncode}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    logits = [np.load(work / f"llamacpp-{i}.npy") for i in range(len(prompts))]
    return logits, result["greedy"], result["tokens"]


def _leading(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _compare(ref_logits, ref_greedy, cpp_logits, cpp_greedy, margins=None) -> dict:
    import numpy as np

    worst_abs = worst_rel = 0.0
    top1 = positions = 0
    per_position = []  # max |diff| of each position relative to its prompt's max |logit|
    for ref, got in zip(ref_logits, cpp_logits):
        vocab = min(ref.shape[-1], got.shape[-1])  # llama.cpp's vocabulary may be the padded embedding rows
        ref, got = ref[:, :vocab], got[:ref.shape[0], :vocab]
        diff = float(np.abs(ref - got).max())
        worst_abs = max(worst_abs, diff)
        worst_rel = max(worst_rel, diff / float(np.abs(ref).max()))
        per_position += list(np.abs(ref - got).max(-1) / float(np.abs(ref).max()))
        top1 += int((ref.argmax(-1) == got.argmax(-1)).sum())
        positions += ref.shape[0]
    leading = [_leading(a, b) for a, b in zip(ref_greedy, cpp_greedy)]
    # where a greedy continuation first differs: the reference's margin between its top two logits there
    split_margins = [round(m[n], 4) for n, m, a in zip(leading, margins or [], ref_greedy) if n < len(a)]
    total = sum(len(a) for a in ref_greedy)
    return {"max_abs_logit_diff": round(worst_abs, 6), "max_rel_logit_diff": round(worst_rel, 6),
            "median_rel_logit_diff": round(float(np.median(per_position)), 6),
            "top1_agreement": round(top1 / positions, 4), "positions": positions,
            "greedy_leading_tokens": leading, "greedy_agreement": round(sum(leading) / max(total, 1), 4),
            "reference_top2_margin_where_greedy_splits": split_margins}


def _tokenizer_agreement(tokenizer, cpp_tokens: list[list[int]]) -> dict:
    """llama.cpp's tokenisation of TOKENIZER_TEXTS (from the file's vocabulary metadata, BOS as it adds it) against
    the transformers tokenizer's (special tokens as it adds them)."""
    ours = [tokenizer(text)["input_ids"] for text in TOKENIZER_TEXTS]
    same = [a == [int(t) for t in b] for a, b in zip(ours, cpp_tokens)]
    first = next((i for i, ok in enumerate(same) if not ok), None)
    return {"texts": len(same), "identical": sum(same),
            "first_difference": None if first is None else {"text": TOKENIZER_TEXTS[first], "transformers": ours[first],
                                                             "llama.cpp": cpp_tokens[first]}}


# Compression methods a real model's GGUF can be served from (--methods): the command and its method arguments.
# A row of a method other than rtn is labelled "MODEL [METHOD]".
METHODS = {"rtn": ("rtn", []), "gptq": ("gptq", []), "obr": ("obr", ["--sparsity", "0"]),
           "obr-s50": ("obr", ["--sparsity", "0.5"]), "gptq-s50": ("gptq", ["--sparsity", "0.5"])}


def run_one(label: str, model: str, work: Path, python: str, new_tokens: int, length: int, calibration: Path,
            extra: list[str], method: str = "rtn") -> dict:
    import shutil

    from toolkit.export.quantized import from_packed

    command_name, method_args = METHODS[method]
    out = work / re.sub(r"[^A-Za-z0-9@._-]+", "-", label).strip("-") / "run"
    if out.exists():
        shutil.rmtree(out)
    args = ["compress", command_name, "-m", model, "-d", calibration, "--w-bits", "4", "--a-bits", "16",
            "--kv-bits", "16", *method_args,
            "--no-rotate", "--nsamples", "4", "--seqlen", "64", "--set", "eval_windows=1", "--set",
            "eval_max_length=64", "--set", "export=gguf", "-o", out, "--json", *extra]
    command = "iclrkit " + " ".join(str(a) for a in args)
    started = time.process_time()
    import dataclasses

    import toolkit.export.gguf as writer

    saved = dict(writer.LAYOUTS)
    if label in CONTROLS:  # the deliberate layout error of a negative control
        writer.LAYOUTS["llama"] = dataclasses.replace(writer.LAYOUTS["llama"], permute_qk=False)
        command += "  # with toolkit.export.gguf.LAYOUTS['llama'].permute_qk = False"
    try:
        code, stdout, stderr = _cli(*[os.path.expanduser(a) if isinstance(a, str) and a.startswith("~") else a
                                      for a in args])
    finally:
        writer.LAYOUTS.clear()
        writer.LAYOUTS.update(saved)
    row = {"model": label, "command": command}
    if code == 2:
        row.update(status="refused", reason=next((ln for ln in stderr.splitlines() if ln.startswith("error:")),
                                                  stderr.strip()[-300:]))
        return row
    if code != 0:
        row.update(status="compress failed", reason=stderr.strip()[-400:])
        return row
    record = json.loads(stdout)
    gguf = next((out / "gguf").glob("*.gguf"))
    q = from_packed(out / "packed")
    prompts = _prompts(q.tokenizer, length)
    text = getattr(q.model.config, "text_config", None) or q.model.config
    n_ctx = min(int(getattr(text, "max_position_embeddings", 0) or 2048), 512)
    ref_logits, ref_greedy, ref_margins = _reference(out / "packed", prompts, new_tokens, fp16_scales=False)
    half_logits, half_greedy, half_margins = _reference(out / "packed", prompts, new_tokens, fp16_scales=True)
    try:
        cpp_logits, cpp_greedy, cpp_tokens = _llamacpp(gguf, prompts, new_tokens, python, out, n_ctx)
    except RuntimeError as exc:
        row.update(status="llama.cpp failed", reason=str(exc)[-600:])
        return row
    row.update(status="ok", architecture=record["metrics"]["gguf"].get("architecture"),
               gguf_notes=record["metrics"]["gguf"].get("notes", []),
               gguf_mb=record["metrics"]["gguf"]["size_mb"], prompts=len(prompts),
               prompt_tokens=[len(p) for p in prompts], new_tokens=new_tokens,
               vs_packed=_compare(ref_logits, ref_greedy, cpp_logits, cpp_greedy, ref_margins),
               vs_fp16_scales=_compare(half_logits, half_greedy, cpp_logits, cpp_greedy, half_margins),
               fp16_scales_vs_packed=_compare(ref_logits, ref_greedy, half_logits, half_greedy, ref_margins),
               tokenizer=_tokenizer_agreement(q.tokenizer, cpp_tokens),
               cpu_seconds=round(time.process_time() - started, 1))
    return row


def render(results: dict) -> str:
    lines = ["# GGUF export: llama.cpp vs iclrkit, per architecture", "",
             ("Rows of several runs, each with its own command and commit in results.json; last written by "
              if results.get("merged_rows") else "Generated by ") +
             f"`{results['command']}` at commit `{results['commit']}` "
             f"({_machine_text(results['machine'])}; llama-cpp-python {results['llama_cpp_python']}, llama.cpp CPU, "
             "one thread).", "",
             "Each model is compressed with `iclrkit compress rtn --w-bits 4 --no-rotate --set export=gguf` (a real "
             "model's `[gptq]`, `[obr]`, `[obr-s50]` rows with `compress gptq|obr`, W4A16, `--sparsity 0|0.5`; the row's "
             "command is in results.json); llama.cpp evaluates the .gguf on the same token ids as iclrkit's packed "
             "model (4 prompts). Columns: max |logit difference| over every prompt position (absolute / relative "
             "to the prompt's max |logit|), top-1 agreement at every position, leading greedy tokens that agree "
             f"({results['new_tokens']} per prompt); `fp16 scales` compares llama.cpp with the packed model whose "
             "row scales are rounded to fp16 as the file stores them; `tokenizer`: texts (of 9: the prompts, digits, "
             "spaces and newlines, accents, CJK, emoji, code) that llama.cpp tokenises from the file's vocabulary "
             "exactly as the transformers tokenizer does. llama.cpp's CPU Q4_0 kernels quantize activations to 8 "
             "bits (Q8_0) and keep the KV cache in fp16: per-position differences of ~1e-3..3e-2 relative are its "
             "arithmetic; isolated larger ones in MoE rows are routing flips at near-tied router scores. The tiny "
             "models' weights are drawn at a trained model's scale (matrices N(0, 1/fan_in), embeddings N(0, 1), "
             "norm scales 1 ± 0.2): the `!unpermuted-qk` rows are negative controls, Llama written with its q/k "
             "rows left in transformers' order, on these weights and on transformers' default 0.02 init, i.e. what "
             "a layout error looks like here.", "",
             "| model | llama.cpp arch | max abs diff | max rel diff | median rel diff | top-1 | greedy | "
             "vs fp16 scales: max abs | top-1 | greedy | tokenizer |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    refused = []
    for row in results["rows"]:
        if row["status"] != "ok":
            refused.append(row)
            continue
        a, b = row["vs_packed"], row["vs_fp16_scales"]
        t = row["tokenizer"]
        lines.append(f"| {row['model']} | {row['architecture']} | {a['max_abs_logit_diff']:.3g} | "
                     f"{a['max_rel_logit_diff']:.3g} | {a['median_rel_logit_diff']:.2g} | {a['top1_agreement']:.1%} | "
                     f"{a['greedy_agreement']:.1%} | {b['max_abs_logit_diff']:.3g} | {b['top1_agreement']:.1%} | "
                     f"{b['greedy_agreement']:.1%} | {t['identical']}/{t['texts']} |")
    if refused:
        lines += ["", "Not exported / not served (the reason as the command printed it):", ""]
        lines += [f"- {row['model']}: {row['status']}: {row['reason']}" for row in refused]
    splits = [(row["model"], row["vs_packed"]) for row in results["rows"] if row["status"] == "ok"
              and row["vs_packed"]["reference_top2_margin_where_greedy_splits"]]
    if splits:
        lines += ["", "Where a greedy continuation first differs, the packed model's margin between its two best "
                  "logits at that step (compare with the row's max abs diff):", ""]
        lines += [f"- {model}: margins {a['reference_top2_margin_where_greedy_splits']} (max abs diff "
                  f"{a['max_abs_logit_diff']:.3g})" for model, a in splits]
    notes = [(row["model"], n) for row in results["rows"] for n in row.get("gguf_notes", [])]
    if notes:
        lines += ["", "Export notes (also in each export's README.md):", ""]
        lines += [f"- {model}: {note}" for model, note in notes]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    from toolkit.models.tiny import ARCHITECTURES

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--archs", nargs="*", default=[*ARCHITECTURES, *VARIANTS, *CONTROLS])
    parser.add_argument("--real", nargs="*", default=list(REAL),
                        help="real models: zoo names or LABEL=DIRECTORY (e.g. gemma3-270m=~/.cache/iclrkit/zoo/gemma3-270m)")
    parser.add_argument("--no-real", action="store_true")
    parser.add_argument("--methods", nargs="*", default=["rtn"], choices=sorted(METHODS),
                        help="compression methods each real model is served from (the tiny models: rtn only)")
    parser.add_argument("--merge", action="store_true",
                        help="keep the rows of --results that this run does not redo (each row has its own provenance)")
    parser.add_argument("--python", default=DEFAULT_PYTHON, help="the llama-cpp-python interpreter")
    parser.add_argument("--work", type=Path, default=ROOT / "runs" / "gguf-agreement")
    parser.add_argument("--new-tokens", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=24)
    parser.add_argument("--results", type=Path, default=ROOT / "examples" / "gguf" / "results.json")
    parser.add_argument("--render", type=Path, default=ROOT / "examples" / "gguf" / "RESULTS.md")
    args = parser.parse_args(argv)
    if not Path(args.python).is_file():
        print(f"no llama-cpp-python interpreter at {args.python} (see this script's docstring)", file=sys.stderr)
        return 3
    import torch

    torch.set_num_threads(1)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from toolkit.data.text import embedded_text
    from toolkit.zoo.lm import train_tokenizer

    args.work.mkdir(parents=True, exist_ok=True)
    calibration = args.work / "inputs" / "calibration.txt"
    calibration.parent.mkdir(exist_ok=True)
    calibration.write_text(embedded_text()[:20_000])
    tokenizer = train_tokenizer(embedded_text()[:200_000], vocab_size=300)  # the architecture matrix's tokenizer
    version = subprocess.run([args.python, "-c", "import llama_cpp; print(llama_cpp.__version__)"],
                             capture_output=True, text=True).stdout.strip()
    start = {"load": " ".join(f"{x:.2f}" for x in os.getloadavg()), "code": provenance.code_state()}
    script = "python examples/gguf/agreement.py " + " ".join(argv if argv is not None else sys.argv[1:])
    results = {**_provenance(script, start), "llama_cpp_python": version, "new_tokens": args.new_tokens, "rows": []}
    jobs = [(arch, str(_tiny_model(arch, args.work, tokenizer)), [], "rtn") for arch in args.archs]
    if not args.no_real:  # NAME or LABEL=DIRECTORY (a ~ is expanded here, and kept in the recorded command)
        for spec in args.real:
            label, _, where = spec.rpartition("=") if "=" in spec else (spec, "", spec)
            for method in args.methods:
                jobs.append((label if method == "rtn" else f"{label} [{method}]", where,
                             ["--nsamples", "8", "--seqlen", "128"], method))
    previous = json.loads(args.results.read_text())["rows"] if args.merge and args.results.is_file() else []
    if previous:
        results["merged_rows"] = len(previous)
    fresh: dict[str, dict] = {}
    for label, model, extra, *method in jobs:
        try:
            row = run_one(label, model, args.work, args.python, args.new_tokens, args.prompt_tokens, calibration,
                          extra, *method)
        except Exception as exc:  # noqa: BLE001 - one model's failure is a row, not the end of the benchmark
            row = {"model": label, "status": "failed", "reason": f"{type(exc).__name__}: {exc}"}
        row.update(_provenance(row.get("command", script), start))  # a row without its own command: the script's
        fresh[label] = row  # --merge: a redone row keeps its place, a new one goes last
        known = {r["model"] for r in previous}
        results["rows"] = ([fresh.get(r["model"], r) for r in previous]
                           + [r for name, r in fresh.items() if name not in known])
        results.update(_provenance(script, start))  # the file's date: when it was last written
        summary = row.get("vs_packed") or row.get("reason", "")
        print(f"{label:18s} {row['status']:16s} {summary}", flush=True)
        args.results.parent.mkdir(parents=True, exist_ok=True)
        args.results.write_text(json.dumps(results, indent=1) + "\n")
    if args.render is not None:
        args.render.write_text(render(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
