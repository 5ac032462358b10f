"""The architecture matrix: every model command on a tiny random model of every architecture in
`toolkit.models.tiny.ARCHITECTURES`, each cell a numeric check or a refusal with its reason.

    python scripts/arch_matrix.py --out runs/arch-matrix          # all cells -> runs/arch-matrix/matrix.json
    python scripts/arch_matrix.py --render examples/models/MATRIX.md --from runs/arch-matrix/matrix.json

tests/cli/test_arch_matrix.py runs the same cells (`run_cell`) in the suite; `EXPECTED_REFUSALS` is what a cell may
refuse (with a fragment of its reason): any other refusal, and any failed check, is a failure.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from toolkit.models.tiny import ARCHITECTURES, MOE  # noqa: E402

CELLS = ("eval-ppl", "compress-rtn", "compress-gptq", "compress-obr-s50", "compress-w4a4kv4-rotated",
         "export-compressed-tensors", "export-gguf", "edit-memit", "steer-pcms", "unlearn-npo", "uq-tokur")

ROTATION_REFUSED = {a: "LayerNorm" for a in ("phi", "cohere", "starcoder2", "stablelm", "falcon", "gpt_neox", "gptj",
                                            "opt", "gpt2", "bloom")}
ROTATION_REFUSED.update({a: "post-norms" for a in ("gemma2", "gemma3_text", "gemma3", "olmo2", "exaone4")})
ROTATION_REFUSED.update({a: "fused experts" for a in MOE})  # W4A4: expert activations live inside one forward
GGUF_REFUSED = {"opt": "llama.cpp has no loader for opt", "gptj": "no loader or graph for it",
                "qwen3_moe": "always renormalises the top-k routing weights",  # the tiny config's norm_topk_prob
                "olmoe": "normalises k over the full hidden width"}  # the tiny config's grouped-query attention
GGUF_ARCHS = tuple(a for a in ARCHITECTURES if a not in GGUF_REFUSED)
EXPECTED_REFUSALS: dict[tuple[str, str], str] = {
    **{(a, "compress-w4a4kv4-rotated"): r for a, r in ROTATION_REFUSED.items()},
    **{(a, "export-gguf"): r for a, r in GGUF_REFUSED.items()},
    ("gpt2", "export-compressed-tensors"): "Conv1D", ("falcon", "export-compressed-tensors"): "cannot reload",
    **{(a, "edit-memit"): "mixture of experts" for a in MOE if a != "qwen2_moe"},
}

FACTS = [("The new name of {}", "object", "the"), ("The new name of {}", "list", "in")]
PAIRS = [("the error raised an exception and the program crashed", "the function returned a value and printed it"),
         ("an exception was raised because the file failed", "a value was returned because the file existed"),
         ("the import failed with an error in the module", "the import worked with a name in the module")]
SMALL = ["--nsamples", "2", "--seqlen", "16", "--set", "eval_windows=1", "--set", "eval_max_length=32"]


@dataclass
class Cell:
    status: str  # pass | refused | fail
    detail: str = ""
    seconds: float = 0.0
    figures: dict = field(default_factory=dict)


class Bench:
    """One architecture's tiny model, data files and an in-process CLI, under `root`."""

    def __init__(self, arch: str, root: Path, tokenizer):
        import torch

        from toolkit.models.tiny import build_tiny

        self.arch, self.root = arch, root
        root.mkdir(parents=True, exist_ok=True)
        self.model_dir = root / "model"
        if not (self.model_dir / "config.json").exists():
            torch.manual_seed(0)
            build_tiny(arch, len(tokenizer)).save_pretrained(self.model_dir)
            tokenizer.save_pretrained(self.model_dir)
        data = root / "data"  # inputs in a folder of their own: an --out never goes into an input's folder
        data.mkdir(exist_ok=True)
        self.text = data / "text.txt"
        from toolkit.data.text import embedded_text

        self.text.write_text(embedded_text()[:20_000])
        self.facts = data / "facts.jsonl"
        self.facts.write_text("\n".join(json.dumps({"prompt": p, "subject": s, "target_new": t}) for p, s, t in FACTS))
        self.pairs = data / "pairs.jsonl"
        self.pairs.write_text("".join(json.dumps({"undesired": u, "neutral": n}) + "\n" for u, n in PAIRS))
        docs = [self.text.read_text()[i:i + 200] for i in range(0, 1600, 200)]
        self.forget, self.retain = data / "forget.json", data / "retain.json"
        self.forget.write_text(json.dumps(docs[:2]))
        self.retain.write_text(json.dumps(docs[2:4]))
        self.gsm = data / "gsm.jsonl"
        self.gsm.write_text("".join(json.dumps({"question": f"What is {a} plus {a}?",
                                                "answer": f"{a} + {a} = {2 * a}\n#### {2 * a}"}) + "\n"
                                    for a in (1, 2, 3)))

    def cli(self, *args) -> tuple[int, str, str]:
        from typer.testing import CliRunner

        from cli.main import app

        result = CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False)
        return result.exit_code, result.stdout, result.stderr

    def out(self, name: str) -> Path:
        path = self.root / name
        if path.exists():
            import shutil

            shutil.rmtree(path)
        return path


def _refusal(code: int, stderr: str) -> Cell | None:
    if code == 2:
        line = next((ln for ln in stderr.splitlines() if ln.startswith("error:")), stderr.strip()[-300:])
        return Cell("refused", line)
    if code != 0:
        return Cell("fail", f"exit {code}: {stderr.strip()[-400:]}")
    return None


def _state(directory: Path) -> dict:
    """The model's tensors by their in-memory names (transformers converts per-expert checkpoints to fused)."""
    from transformers import AutoModelForCausalLM

    return {k: v.detach() for k, v in AutoModelForCausalLM.from_pretrained(directory).state_dict().items()}


def _on_grid(before: dict, after: dict, bench: Bench, bits: int = 4) -> tuple[bool, str, float]:
    """Every discovered slot changed and holds at most 2^bits values per row (codes x one scale: per channel);
    every tensor outside the slots is unchanged. Returns (ok, why, zero fraction over the slots)."""
    import torch
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    from toolkit.models.view import view_of

    with init_empty_weights():
        config = AutoConfig.from_pretrained(bench.model_dir)
        view = view_of(AutoModelForCausalLM.from_config(config))
    params = {}
    for index in range(len(view)):
        from toolkit.models.layout import structural_slots

        for slot in structural_slots(view.blocks[index])[0]:
            params.setdefault(f"{view.layers_path}.{index}.{slot.module}.{slot.param}", []).append(slot)
    zeros = total = 0
    for name, slots in params.items():
        if name not in after:
            return False, f"{name} missing from the output", 0.0
        if torch.equal(after[name], before[name]):
            return False, f"{name} unchanged", 0.0
        weight = after[name].float()
        rows = weight.reshape(-1, weight.shape[-1]) if slots[0].kind != "conv1d" else weight.t()
        for row in rows[:8]:
            values = row[row != 0].abs().unique()
            if values.numel() > 2 ** (bits - 1):
                return False, f"{name}: a row holds {values.numel()} magnitudes (> {2 ** (bits - 1)})", 0.0
        zeros += int((weight == 0).sum())
        total += weight.numel()
    others = [n for n in before if n not in params and n in after and not torch.equal(before[n], after[n])]
    if others:
        return False, f"tensors outside the slots changed: {others[:3]}", 0.0
    return True, f"{len(params)} slot tensors on the {bits}-bit grid", zeros / max(total, 1)


def cell_eval_ppl(b: Bench) -> Cell:
    """ppl of one 32-token window equals exp(transformers' own loss) on the same tokens (BOS first when the
    tokenizer adds one)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from toolkit.data.text import tokenize
    from toolkit.models.tokens import bos_id

    code, stdout, stderr = b.cli("eval", "ppl", "-m", b.model_dir, "-d", b.text, "--max-length", "32",
                                 "--max-windows", "1", "-o", b.out("ppl"), "--json")
    if (refused := _refusal(code, stderr)) is not None:
        return refused
    ppl = json.loads(stdout)["metrics"]["ppl"]
    tokenizer = AutoTokenizer.from_pretrained(b.model_dir)
    model = AutoModelForCausalLM.from_pretrained(b.model_dir).eval()
    ids = tokenize(tokenizer, b.text.read_text())
    bos = bos_id(tokenizer)
    window = ids[:31] if bos is not None else ids[:32]
    if bos is not None:
        window = torch.cat([torch.tensor([bos]), window])
    with torch.no_grad():
        logits = model(window[None]).logits[0].float()
    reference = math.exp(torch.nn.functional.cross_entropy(logits[:-1], window[1:]).item())
    ok = math.isfinite(ppl) and abs(ppl - reference) <= 1e-4 * reference
    return Cell("pass" if ok else "fail", f"ppl {ppl:.4g} vs transformers {reference:.4g}", figures={"ppl": ppl})


def _compress(b: Bench, method: str, *extra) -> tuple[Cell | None, dict]:
    out = b.out(f"c-{method}")
    code, stdout, stderr = b.cli("compress", method, "-m", b.model_dir, "-d", b.text, *SMALL, "--set",
                                 f"eval_data={b.text}", "--set", "export=dense", "-o", out, "--json", *extra)
    if (refused := _refusal(code, stderr)) is not None:
        return refused, {}
    record = json.loads(stdout)
    return None, {"metrics": record["metrics"], "out": out}


def _grid_cell(b: Bench, method: str, *extra, sparsity: float | None = None) -> Cell:
    refused, result = _compress(b, method, "--w-bits", "4", "--a-bits", "16", "--kv-bits", "16", "--no-rotate",
                                *extra)
    if refused is not None:
        return refused
    metrics = result["metrics"]
    ok, why, zeros = _on_grid(_state(b.model_dir), _state(result["out"] / "model"), b)
    ppl = metrics.get("ppl", float("nan"))
    if ok and not math.isfinite(ppl):
        ok, why = False, f"ppl {ppl}"
    if ok and sparsity is not None and abs(metrics["sparsity"] - sparsity) > 0.05:
        ok, why = False, f"sparsity {metrics['sparsity']} vs {sparsity}"
    return Cell("pass" if ok else "fail", f"{why}; ppl {ppl:.4g}; sparsity {metrics['sparsity']:.3f}",
                figures={"ppl": ppl, "sparsity": metrics["sparsity"], "linears": metrics["linears"]})


def cell_rtn(b: Bench) -> Cell:
    return _grid_cell(b, "rtn")


def cell_gptq(b: Bench) -> Cell:
    return _grid_cell(b, "gptq")


def cell_obr(b: Bench) -> Cell:
    return _grid_cell(b, "obr", "--sparsity", "0.5", sparsity=0.5)


def cell_w4a4kv4(b: Bench) -> Cell:
    refused, result = _compress(b, "gptq", "--w-bits", "4", "--a-bits", "4", "--kv-bits", "4", "--rotate")
    if refused is not None:
        return refused
    metrics = result["metrics"]
    ok = metrics["rotated"] is True and math.isfinite(metrics["ppl"])
    return Cell("pass" if ok else "fail", f"rotated {metrics['rotated']}; ppl {metrics['ppl']:.4g} (A4/KV4 simulated)",
                figures={"ppl": metrics["ppl"]})


def _export(b: Bench, fmt: str) -> tuple[Cell | None, Path]:
    out = b.out(f"x-{fmt}")
    code, _, stderr = b.cli("compress", "rtn", "-m", b.model_dir, "-d", b.text, *SMALL, "--w-bits", "4",
                            "--no-rotate", "--set", f"export={fmt}", "-o", out, "--json")
    return _refusal(code, stderr), out


def cell_compressed_tensors(b: Bench) -> Cell:
    """The compressed-tensors directory reloads in plain transformers with the in-memory model's logits: the same
    deterministic run exported dense (the fake-quant weights as they were in memory, float32) is the reference."""
    import torch
    from transformers import AutoModelForCausalLM

    refused, out = _export(b, "compressed-tensors")
    if refused is not None:
        return refused
    dense_refused, dense = _export(b, "dense")
    if dense_refused is not None:
        return Cell("fail", f"the dense reference run failed: {dense_refused.detail}")
    reloaded = AutoModelForCausalLM.from_pretrained(out / "compressed-tensors").eval()
    reference = AutoModelForCausalLM.from_pretrained(dense / "model").eval()
    ids = torch.randint(3, 200, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got, want = reloaded(ids).logits.float(), reference(ids).logits.float()
    relative = float((got - want).abs().max() / want.abs().max())
    ok = relative <= 1e-5
    return Cell("pass" if ok else "fail", f"reload vs in-memory (dense export) logits: max relative diff "
                f"{relative:.1e}", figures={"relative_diff": relative})


def gguf_grid_check(path: Path, q) -> tuple[bool, str, dict]:
    """Every quantized slot of `q` (a QuantizedModel: the run's packed grids) is in the GGUF file as Q4_0 under the
    name gguf's own tensor map gives it (experts: its row block of ffn_{gate,up,down}_exps): the same rows of codes
    (as a multiset: llama.cpp's layouts permute rows), each block's d = fp16(c·s) of the row's scale s (c = 1, except
    Gemma 2's q rows, where c = llama.cpp's attention scale over transformers'), and so every decoded weight within
    fp16 rounding of the grid weight (|w_gguf/c − w| ≤ 2^-11·|w|). No other Q4_0 tensor in the file."""
    import gguf
    import numpy as np

    from toolkit.export.gguf import read_q4_0
    from toolkit.export.gguf.q4_0 import grid_block_scales
    from toolkit.export.gguf.tensors import name_for

    metadata, grids, _ = read_q4_0(path)
    arch = metadata["general.architecture"]
    view = q.view
    text = getattr(q.model.config, "text_config", None) or q.model.config
    names = gguf.get_tensor_name_map({v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}[arch], len(view))
    decoder = view.layers_path.rsplit(".", 1)[0] if "." in view.layers_path else ""
    expected: list[tuple[str, int | None, np.ndarray, np.ndarray]] = []
    for slot_name, grid in q.linears.items():
        _, slot = view.resolve(slot_name)
        codes, scales = grid.codes.numpy(), grid_block_scales(grid)
        if slot.kind != "expert":
            expected.append((name_for(names, slot_name + ".weight", decoder), None, codes, scales))
            continue
        index = int(slot_name[len(view.layers_path) + 1:].split(".", 1)[0])
        kinds = ([gguf.MODEL_TENSOR.FFN_DOWN_EXP] if slot.param == "down_proj"
                 else [gguf.MODEL_TENSOR.FFN_GATE_EXP, gguf.MODEL_TENSOR.FFN_UP_EXP])
        rows = codes.shape[0] // len(kinds)
        for k, kind in enumerate(kinds):
            part = slice(k * rows, (k + 1) * rows)
            expected.append((gguf.TENSOR_NAMES[kind].format(bid=index) + ".weight", slot.expert, codes[part],
                             scales[part]))
    heads = int(text.num_attention_heads)
    head_dim = int(getattr(text, "head_dim", None) or text.hidden_size // heads)
    worst, seen = 0.0, set()
    for name, expert, codes, scales in expected:
        if name not in grids:
            return False, f"{name} (a quantized slot) is not a Q4_0 tensor of the file", {}
        seen.add(name)
        got_codes, got_d = grids[name]
        if expert is not None:
            got_codes, got_d = got_codes[expert], got_d[expert]
        if got_codes.shape != codes.shape:
            return False, f"{name}: shape {got_codes.shape} vs the grid's {codes.shape}", {}
        c = 1.0
        if arch == "gemma2" and name.split(".")[2] == "attn_q":
            denominator = text.hidden_size / heads if len(view) == 46 else head_dim
            c = float(np.sqrt(denominator / text.query_pre_attn_scalar))
        want_d = (scales.astype(np.float32) * np.float32(c)).astype(np.float16)
        order_got = np.lexsort(np.concatenate([got_d.astype(np.float32), got_codes], axis=1).T[::-1])
        order_want = np.lexsort(np.concatenate([want_d.astype(np.float32), codes], axis=1).T[::-1])
        if not np.array_equal(got_codes[order_got], codes[order_want]):
            return False, f"{name}: its rows of codes are not the grid's", {}
        if not np.array_equal(got_d[order_got], want_d[order_want]):
            return False, f"{name}: block scales are not fp16(c * s) of the grid's row scales (c = {c:g})", {}
        weight = codes[order_want] * np.repeat(scales[order_want], 32, axis=1)
        decoded = got_codes[order_got] * np.repeat(got_d[order_got].astype(np.float64), 32, axis=1) / c
        excess = np.abs(decoded - weight) - 2.0 ** -11 * np.abs(weight)
        if excess.max() > 1e-12:
            return False, f"{name}: a decoded weight is off the grid weight by more than fp16 rounding", {}
        worst = max(worst, float((np.abs(decoded - weight) / np.maximum(np.abs(weight), 1e-30)).max()))
    extra = sorted(set(grids) - seen)
    if extra:
        return False, f"Q4_0 tensors with no quantized slot behind them: {extra[:3]}", {}
    return True, (f"{len(seen)} Q4_0 tensors ({len(q.linears)} slots): codes equal the packed grid's, weights within "
                  f"fp16 scale rounding (max rel {worst:.1e} <= 2^-11)"), {"q4_0": len(seen), "max_rel": worst}


def cell_gguf(b: Bench) -> Cell:
    """compress rtn --set export=gguf: the file's Q4_0 tensors decode to the run's packed grid weights within the
    fp16 scale rounding (gguf_grid_check), and it names llama.cpp's architecture."""
    from toolkit.export.quantized import from_packed
    from toolkit.models.archs import traits

    refused, out = _export(b, "gguf")
    if refused is not None:
        return refused
    files = list((out / "gguf").glob("*.gguf"))
    ok, detail, figures = gguf_grid_check(files[0], from_packed(out / "packed"))
    import gguf

    arch = gguf.GGUFReader(str(files[0])).fields["general.architecture"].contents()
    if ok and arch != traits(b.arch).gguf_arch:
        ok, detail = False, f"general.architecture {arch!r}, expected {traits(b.arch).gguf_arch!r}"
    return Cell("pass" if ok else "fail", f"{arch}: {detail}", figures=figures)


def cell_memit(b: Bench) -> Cell:
    out = b.out("memit")
    code, _, stderr = b.cli("edit", "memit", "-m", b.model_dir, "-d", b.facts, "-o", out, "--set",
                            f"stats_dir={b.root / 'stats'}", "--steps", "8", "--mom2-weight", "1",
                            "--set", "cov_tokens=256", "--set", "cov_seqlen=32", "--set", "context_prefixes=1",
                            "--set", "prefix_tokens=3", "--set", "fluency_samples=0", "--set", "clamp_factor=4",
                            "--set", "v_weight_decay=0", "--set", "kl_factor=0")
    if (refused := _refusal(code, stderr)) is not None:
        return refused
    import torch

    from toolkit.models.view import view_of

    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    gains = [row["post"]["logp_new"] - row["pre"]["logp_new"] for row in rows]
    before, after = _state(b.model_dir), _state(out / "model")
    changed = {n for n in after if not torch.equal(after[n], before[n])}
    from transformers import AutoModelForCausalLM

    view = view_of(AutoModelForCausalLM.from_pretrained(out / "model"))
    layers = json.loads((out / "run.json").read_text())["metrics"]["layers"]
    targets = {f"{view.full_name(i, view.mlp_out(i))}.weight" for i in layers}
    ok = all(g > 0.05 for g in gains) and changed == targets
    return Cell("pass" if ok else "fail", f"log p(new) gains {[round(g, 2) for g in gains]}; changed exactly the "
                f"MLP output projections of layers {layers}: {changed == targets}", figures={"gain_min": min(gains)})


def cell_steer(b: Bench) -> Cell:
    import torch

    from toolkit.steer.intervene import load_directions

    out = b.out("steer")
    code, _, stderr = b.cli("steer", "pcms", "-m", b.model_dir, "-d", b.pairs, "--layer", "1", "-o", out)
    if (refused := _refusal(code, stderr)) is not None:
        return refused
    directions, _ = load_directions(out / "directions.safetensors")
    norm = float(directions[1].norm())
    ok = math.isfinite(norm) and norm > 0 and torch.isfinite(directions[1]).all()
    return Cell("pass" if ok else "fail", f"direction at block 1, norm {norm:.3g}", figures={"norm": norm})


def cell_unlearn(b: Bench) -> Cell:
    import torch

    out = b.out("npo")
    code, _, stderr = b.cli("unlearn", "npo", "-m", b.model_dir, "-f", b.forget, "-r", b.retain, "-o", out,
                            "--max-length", "24", "--epochs", "1", "--batch-size", "2", "--lr", "1e-3")
    if (refused := _refusal(code, stderr)) is not None:
        return refused
    before, after = _state(b.model_dir), _state(out / "model")
    changed = sum(1 for n in before if n in after and not torch.equal(before[n], after[n]))
    finite = all(torch.isfinite(t).all() for t in after.values() if t.is_floating_point())
    ok = changed > 0 and finite
    return Cell("pass" if ok else "fail", f"{changed} tensors moved, all finite: {finite}",
                figures={"changed": changed})


def cell_tokur(b: Bench) -> Cell:
    out = b.out("tokur")
    code, _, stderr = b.cli("uq", "tokur", "-m", b.model_dir, "-d", b.gsm, "--candidates", "2", "--samples", "2",
                            "--sigma", "0.05", "--rank", "2", "--max-new-tokens", "3", "--limit", "1", "-o", out)
    if (refused := _refusal(code, stderr)) is not None:
        return refused
    records = [json.loads(line) for line in (out / "responses.jsonl").read_text().splitlines()]
    ok = bool(records) and all(r["epistemic"] >= 0 and abs(r["total"] - r["aleatoric"] - r["epistemic"]) < 1e-6
                               for r in records)
    return Cell("pass" if ok else "fail", f"{len(records)} responses; total = aleatoric + epistemic",
                figures={"epistemic": records[0]["epistemic"] if records else None})


RUNNERS = {"eval-ppl": cell_eval_ppl, "compress-rtn": cell_rtn, "compress-gptq": cell_gptq,
           "compress-obr-s50": cell_obr, "compress-w4a4kv4-rotated": cell_w4a4kv4,
           "export-compressed-tensors": cell_compressed_tensors, "export-gguf": cell_gguf, "edit-memit": cell_memit,
           "steer-pcms": cell_steer, "unlearn-npo": cell_unlearn, "uq-tokur": cell_tokur}


def judge(arch: str, cell_name: str, cell: Cell) -> Cell:
    """A refusal counts only where expected, with its reason; anything else is a failure."""
    expected = EXPECTED_REFUSALS.get((arch, cell_name))
    if cell.status == "refused" and (expected is None or expected not in cell.detail):
        return Cell("fail", f"unexpected refusal: {cell.detail}", cell.seconds)
    if cell.status == "pass" and expected is not None:
        return Cell("fail", f"passed where a refusal ('{expected}') is declared: update EXPECTED_REFUSALS",
                    cell.seconds)
    return cell


def run_cell(arch: str, cell_name: str, root: Path, tokenizer) -> Cell:
    started = time.perf_counter()
    try:
        cell = RUNNERS[cell_name](Bench(arch, root / arch, tokenizer))
    except Exception as exc:  # noqa: BLE001 - a crash is a failed cell, reported with where it happened
        import traceback

        cell = Cell("fail", f"{type(exc).__name__}: {exc} @ {traceback.format_exc().splitlines()[-3].strip()}")
    cell.seconds = round(time.perf_counter() - started, 2)
    return judge(arch, cell_name, cell)


def tokenizer_for_matrix():
    from toolkit.data.text import embedded_text
    from toolkit.zoo.lm import train_tokenizer

    return train_tokenizer(embedded_text()[:200_000], vocab_size=300)


def render(results: dict) -> str:
    lines = ["# Architecture matrix", "",
             "Generated by `python scripts/arch_matrix.py` (tiny random models of each architecture, built from "
             "transformers' own configs; `tests/cli/test_arch_matrix.py` runs the same cells). Each cell is a numeric "
             "check (✓) or a refusal with its reason (—, exit 2); the notes below the table give each check.", "",
             "| architecture | " + " | ".join(CELLS) + " |", "|---|" + "---|" * len(CELLS)]
    reasons: dict[str, list[str]] = {}
    for arch in results["archs"]:
        row = []
        for cell_name in CELLS:
            cell = results["cells"].get(f"{arch}/{cell_name}")
            if cell is None:
                row.append(" ")
            elif cell["status"] == "pass":
                row.append("✓")
            elif cell["status"] == "refused":  # one note per kind of refusal, with one example of its message
                kind = EXPECTED_REFUSALS.get((arch, cell_name), "other")
                reasons.setdefault(kind, [cell["detail"].removeprefix("error: ").split(" (hint")[0], []])
                reasons[kind][1].append(arch)
                row.append(f"— [{list(reasons).index(kind) + 1}]")
            else:
                row.append("✗")
        lines.append(f"| {arch} | " + " | ".join(row) + " |")
    lines += ["", "Refusals (exit 2, one line on stderr, nothing written; one example message per kind):", ""]
    lines += [f"{i}. {example} — {', '.join(dict.fromkeys(archs))}"
              for i, (example, archs) in enumerate(reasons.values(), 1)]
    lines += ["", "Checks:", "",
              "- eval-ppl: one 32-token window's perplexity equals exp of transformers' own loss on it (BOS first "
              "where the tokenizer adds one), 1e-4 relative.",
              "- compress rtn / gptq / obr-s50 (W4A16, unrotated): every discovered slot (each Linear, each expert of a "
              "fused expert tensor) changed and holds at most 8 magnitudes per row (a 4-bit symmetric grid), no other "
              "tensor changed, finite perplexity; OBR's sparsity 0.5 ± 0.05.",
              "- compress-w4a4kv4-rotated: `--rotate` accepted (the rotation is exact for the architecture: "
              "tests/unit/test_arch_rotation.py checks the logits) and finite simulated perplexity.",
              "- export-compressed-tensors: the directory reloads in plain transformers; its logits equal the "
              "in-memory model's (the same run's dense export) to 1e-5 relative; MoE experts are written one by one "
              "under the checkpoint's own names.",
              "- export-gguf: the file names llama.cpp's architecture; every quantized slot is a Q4_0 tensor (experts: "
              "their rows of ffn_*_exps) whose rows of codes are the packed grid's (as a multiset: llama.cpp's "
              "layouts permute q/k and fused q/k/v rows) and whose weights equal the grid weights within the fp16 "
              "scale rounding (2^-11 relative). llama.cpp's own logits: examples/gguf/RESULTS.md.",
              "- edit-memit: log p(new target) rises by > 0.05 for both facts, and exactly the edited layers' MLP "
              "output projections changed (the shared expert's for Qwen2-MoE).",
              "- steer-pcms: a finite, non-zero direction at block 1.",
              "- unlearn-npo: one epoch moves the weights, all finite.",
              "- uq-tokur: one question, 2 candidates: epistemic ≥ 0 and total = aleatoric + epistemic.", ""]
    seconds = sum(c["seconds"] for c in results["cells"].values())
    lines.append(f"{len(results['cells'])} cells, {seconds:.0f} s in all ({results.get('machine', '')}).")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "arch-matrix")
    parser.add_argument("--archs", nargs="*", default=list(ARCHITECTURES))
    parser.add_argument("--cells", nargs="*", default=list(CELLS))
    parser.add_argument("--render", type=Path, help="write the table (markdown) here")
    parser.add_argument("--from", dest="source", type=Path, help="render an earlier matrix.json instead of running")
    args = parser.parse_args(argv)
    if args.source is not None:
        results = json.loads(args.source.read_text())
    else:
        import os

        import torch

        torch.set_num_threads(1)
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("ICLRKIT_ZOO_DIR", str(args.out / "zoo"))
        tokenizer = tokenizer_for_matrix()
        results = {"archs": args.archs, "cells": {}, "machine": f"{os.cpu_count()} cores, one thread"}
        for arch in args.archs:
            for cell_name in args.cells:
                cell = run_cell(arch, cell_name, args.out, tokenizer)
                results["cells"][f"{arch}/{cell_name}"] = cell.__dict__
                print(f"{arch:12s} {cell_name:26s} {cell.status:8s} {cell.seconds:6.1f}s  {cell.detail[:110]}",
                      flush=True)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "matrix.json").write_text(json.dumps(results, indent=1))
    if args.render is not None:
        args.render.parent.mkdir(parents=True, exist_ok=True)
        args.render.write_text(render(results))
    failed = [k for k, c in results["cells"].items() if c["status"] == "fail"]
    if failed:
        print(f"{len(failed)} failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
