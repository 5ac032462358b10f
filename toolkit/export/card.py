"""Model cards for exports: what the model is (technique, bits, sparsity, rotation, calibration data, the real
command) and how to serve it (transformers, vLLM for compressed-tensors, llama.cpp for GGUF)."""

from __future__ import annotations

from pathlib import Path

from toolkit.core.records import command_line  # noqa: F401 - re-exported for the export modules

SERVE = {
    "compressed-tensors": (
        "```python\n"
        "# pip install transformers compressed-tensors\n"
        "from transformers import AutoModelForCausalLM, AutoTokenizer\n"
        "model = AutoModelForCausalLM.from_pretrained(\"{path}\")\n"
        "tokenizer = AutoTokenizer.from_pretrained(\"{path}\")\n"
        "```\n\n"
        "vLLM (GPU; W4A16 runs on its Marlin/Machete kernels; the config stores float32, pass a 16-bit dtype):\n\n"
        "```bash\nvllm serve {path} --dtype float16\n```\n"),
    "gguf": (
        "llama.cpp:\n\n```bash\nllama-cli -m {path} -p \"The capital of France is\" -n 32 --temp 0\n"
        "llama-server -m {path}\n```\n\n"
        "llama-cpp-python: `Llama(model_path=\"{path}\")`. transformers (dequantizes to float on load):\n\n"
        "```python\nAutoModelForCausalLM.from_pretrained(\"{dir}\", gguf_file=\"{name}\")\n```\n"),
    "packed": (
        "iclrkit's packed format (INT codes + bitmask) loads with iclrkit only: "
        "`iclrkit eval ppl --model {path} --data ...`, `iclrkit eval tasks --model {path} --tasks ...`, or "
        "`toolkit.compress.packed.load_packed(\"{path}\")` in Python.\n"),
}
LIBRARY = {"compressed-tensors": "transformers", "gguf": "gguf", "packed": "iclrkit"}


def _rotation(metadata: dict) -> str:
    rotation = metadata.get("rotation")
    if not rotation:
        return "none"
    kinds = rotation.get("hadamard") or {"residual": "kron-orthogonal", "head": "kron-orthogonal",
                                         "down_proj": "kron-orthogonal"}  # records before exact Hadamards
    text = (f"QuaRot-style orthogonal rotation fused into the weights (residual seed {rotation.get('residual_seed')}, "
            f"head seed {rotation.get('head_seed')}); the online rotation before down_proj "
            f"(seed {rotation.get('online_down_proj_seed')}, width {rotation.get('intermediate')})")
    if rotation.get("online_o_proj"):
        text += f"; the online cross-head rotation before o_proj ({rotation['online_o_proj'].get('heads')} heads)"
    return text + " — " + ", ".join(f"{name}: {kind}" for name, kind in kinds.items())


def recipe_lines(metadata: dict) -> list[str]:
    """The card line of a recipe run: its recorded stages ([{name: {knob: value}}]) in order, e.g. `- Recipe stages:
    smooth (alpha=0.5) → gptq (w_bits=4, ...)`; none for a method's run."""
    if not metadata.get("stages"):
        return []
    return ["- Recipe stages: " + " → ".join(f"{name} ({', '.join(f'{k}={v}' for k, v in knobs.items())})"
                                            if knobs else name
                                            for stage in metadata["stages"] for name, knobs in stage.items())]


def card_text(kind: str, q, summary: dict, info: dict, path: Path) -> str:
    meta = q.metadata
    prov = q.provenance
    sparsity = meta.get("nm") or meta.get("sparsity", 0)
    rotation = _rotation(meta)
    lines = [
        "---", f"library_name: {LIBRARY[kind]}",
        f"tags: [iclrkit, compress.{meta.get('method', '?')}, {kind}]", "---",
        f"# compress.{meta.get('method', '?')} W{meta.get('w_bits', q.bits)}A{meta.get('a_bits', 16)}"
        f"KV{meta.get('kv_bits', 16)} ({kind})", "",
        f"Produced by iclrkit from `{prov.get('source_model', '?')}`.", "",
        f"- Format: {summary.get('format', kind)}",
        f"- Technique: compress.{meta.get('method', '?')} (weights per output channel, symmetric, MSE-clipped grid)",
        f"- Bits: weights {meta.get('w_bits', q.bits)}, activations {meta.get('a_bits', 16)}, "
        f"KV cache {meta.get('kv_bits', 16)}; embeddings/LM head {meta.get('embed_bits', 16)}",
        f"- Sparsity: {sparsity} (pruned weights are stored as the zero code)",
        f"- Rotation: {rotation}",
        *recipe_lines(meta),
        f"- Calibration data: {prov.get('calibration', '?')}",
        f"- Command: `{info.get('command') or command_line()}`",
    ]
    if prov.get("compress_command"):
        lines.append(f"- Compress command: `{prov['compress_command']}`")
    lines.append("")
    lines += [n for n in _notes(kind, meta, summary, info) if n]
    lines += ["", "## How to serve", "", SERVE[kind].format(path=path, dir=path.parent, name=path.name)]
    if summary:
        lines += ["## Contents", "", *[f"- {k}: {v}" for k, v in summary.items() if k != "rounding"], ""]
    return "\n".join(lines) + "\n"


def _notes(kind: str, meta: dict, summary: dict, info: dict) -> list[str]:
    """The card's notes on what the format holds and what it cannot (folded rotations, activation quantization)."""
    notes = list(info.get("notes", []))
    if kind == "compressed-tensors" and summary.get("folded_down_proj"):
        notes.append("The online rotation before each down_proj is not written as a format transform (an exact "
                     "Hadamard where one is constructed for the width, else (D·H_p)⊗B), so those down_proj linears "
                     "are folded (W·Q_intᵀ) and stored "
                     "unquantized in float32 (listed in `quantization_config.ignore`); every other block linear is "
                     "packed INT. The reload reproduces iclrkit's in-memory logits.")
    if kind == "gguf":
        notes.append(summary.get("rounding", ""))
        if summary.get("float_ffn_down"):
            notes.append("llama.cpp has no online rotation: the rotated down_proj linears are folded (W·Q_intᵀ) and "
                         f"stored as {summary.get('float_type', 'F32')}, every other block linear as Q4_0.")
    if kind == "packed":
        notes.append(f"Activations ({meta.get('a_bits', 16)} bits) and the KV cache ({meta.get('kv_bits', 16)} bits) "
                     "are fake-quantized by iclrkit when it loads this directory (`--model DIR`), as in the run's "
                     "evaluation. W4A16 runs convert to engine formats with `iclrkit export "
                     "compressed-tensors|gguf RUN_DIR`; W4A4/KV4 models stay in this format, because transformers, "
                     "vLLM and llama.cpp do not run iclrkit's online per-token activation/KV quantization.")
    else:
        notes.append("Activations and the KV cache are 16-bit in this export (weight-only). W4A4/KV4 models need "
                     "online activation quantization that transformers, vLLM and llama.cpp do not run with "
                     "iclrkit's per-token grids, so they are kept in iclrkit's packed format.")
    return notes


def write_card(out: Path, kind: str, q, summary: dict, info: dict, target: Path | None = None) -> Path:
    """README.md in `out`; `target` is what to serve (the directory, or the .gguf file)."""
    out = Path(out)
    path = out / "README.md"
    path.write_text(card_text(kind, q, summary, info, final_path(Path(target or out))))
    return path


def final_path(path: Path) -> Path:
    """Where `path` will be once the run finishes: a run writes into OUT.partial and renames it to OUT, so the card
    names the final location (the .partial folder is gone when a user reads it)."""
    return Path(*[part[:-len(".partial")] if part.endswith(".partial") else part for part in path.parts])


def dense_card_notes(config, metadata: dict) -> str:
    """What the dense fake-quant `model/` export of a compress run is, and how to serve it."""
    sparsity = metadata.get("nm") or metadata.get("sparsity", 0)
    calibration = (f"{config.data} ({config.nsamples} windows x {config.seqlen} tokens)" if config.data else "none")
    return "\n".join([
        f"- Technique: compress.{metadata.get('method')}",
        f"- Bits: weights {metadata.get('w_bits')} (group size {metadata.get('group_size') or 'per channel'}), "
        f"activations {metadata.get('a_bits')}, KV cache {metadata.get('kv_bits')} "
        "(activation/KV quantization is not applied by this float checkpoint)",
        f"- Sparsity: {sparsity}",
        f"- Rotation: {_rotation(metadata)} (folded into the weights here)",
        *recipe_lines(metadata),
        f"- Calibration data: {calibration}",
        "",
        "How to serve: `AutoModelForCausalLM.from_pretrained(DIR)` (transformers), `vllm serve DIR` (vLLM runs it "
        "as a float model: no memory saving), or convert the packed/ output with `iclrkit export "
        "compressed-tensors|gguf RUN_DIR` for a real INT4 checkpoint.",
    ])


def write_packed_card(out: Path, metadata: dict, bits: int, provenance: dict, summary: dict) -> Path:
    """README.md of a compress run's packed/ directory."""
    from types import SimpleNamespace

    view = SimpleNamespace(metadata=metadata, provenance=provenance, bits=bits)
    return write_card(out, "packed", view, {"format": "iclrkit packed (INT codes + bitmask)", **summary}, {})
