"""`iclrkit export compressed-tensors|gguf RUN_DIR`: convert a compress run's `packed/` output, and the shared
entry point compress's own `--export compressed-tensors|gguf` goes through."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from toolkit.core.config import BaseConfig
from toolkit.core.errors import BadInputError

FORMATS = ("compressed-tensors", "gguf")


class ExportConfig(BaseConfig):
    """Convert a packed iclrkit model to a format an inference engine serves."""

    run_dir: str  # a compress run directory (holding packed/) or a packed/ directory itself
    format: Literal["compressed-tensors", "gguf"]


def resolve_packed(run_dir: str | Path) -> tuple[Path, dict]:
    """(packed directory, the compress run's run.json or {})."""
    from toolkit.export.quantized import is_packed_dir

    path = Path(run_dir).expanduser()
    if not path.exists():
        raise BadInputError(f"run directory not found: {run_dir}")
    packed = path if is_packed_dir(path) else path / "packed"
    if not is_packed_dir(packed):
        raise BadInputError(f"{run_dir} holds no packed iclrkit model (no packed/model.packed.safetensors)",
                            "run `iclrkit compress ...` with the default --set export=both (or packed) first")
    record = {}
    for candidate in (packed.parent / "run.json", packed / "run.json"):
        if candidate.is_file():
            try:
                record = json.loads(candidate.read_text())
            except (OSError, ValueError):
                record = {}
            break
    return packed, record


def provenance(record: dict, source_model: str | None = None) -> dict:
    config = record.get("config", {}) if isinstance(record, dict) else {}
    data = config.get("data")
    calibration = (f"{data} ({config.get('nsamples')} windows x {config.get('seqlen')} tokens)" if data
                   else "unknown (no run.json next to packed/)")
    return {"source_model": source_model or config.get("model", "?"), "calibration": calibration,
            "compress_command": record.get("command")}


def write_export(fmt: str, q, out: Path, card: dict | None = None) -> dict:
    if fmt == "compressed-tensors":
        from toolkit.export.compressed_tensors import save_compressed_tensors

        return save_compressed_tensors(q, out, card)
    if fmt == "gguf":
        from toolkit.export.gguf import save_gguf

        return save_gguf(q, out, card=card)
    raise BadInputError(f"unknown export format {fmt!r}; choose from {', '.join(FORMATS)}")


def run_export(config: ExportConfig, ctx) -> dict:
    from toolkit.export.quantized import from_packed

    packed, record = resolve_packed(config.run_dir)
    if config.format == "gguf":  # an architecture llama.cpp cannot serve is refused before the model loads
        from transformers import AutoConfig

        from toolkit.export.gguf import check_architecture

        try:
            model_config = AutoConfig.from_pretrained(str(packed))
        except (OSError, ValueError):
            model_config = None  # from_packed names what is wrong with the directory
        if model_config is not None:
            check_architecture(model_config)
    q = from_packed(packed, provenance(record))
    if config.format == "compressed-tensors":
        from toolkit.export.compressed_tensors import check_exportable
    else:
        from toolkit.export.gguf import check_exportable
    check_exportable(q)  # before anything is written
    ctx.inputs["packed"] = str(packed)
    summary = write_export(config.format, q, ctx.out)
    ctx.metrics.update({**{k: v for k, v in summary.items() if k not in ("rounding", "format")},
                        "format": config.format, "layout": summary.get("format")})
    return ctx.metrics


def export_compress_run(config, ctx, view, tokenizer, scales: dict, metadata: dict, g_idx=None) -> dict:
    """compress's `--set export=compressed-tensors|gguf`: write OUT/compressed-tensors or OUT/gguf from the model in
    memory (before the dense export folds the rotation in place)."""
    from toolkit.export.quantized import from_model

    if config.w_bits >= 16:
        raise BadInputError(f"--export {config.export} needs quantized weights (w_bits < 16)")
    calibration = (f"{config.data} ({config.nsamples} windows x {config.seqlen} tokens)" if config.data
                   else "none")
    q = from_model(view, tokenizer, {k: v for k, v in scales.items() if "::" not in k}, config.w_bits,
                   metadata, {"source_model": config.model, "calibration": calibration}, g_idx)
    if config.export == "compressed-tensors":
        from toolkit.export.compressed_tensors import check_exportable
    else:
        from toolkit.export.gguf import check_exportable
    check_exportable(q)
    summary = write_export(config.export, q, ctx.path(config.export))
    ctx.metrics[config.export.replace("-", "_")] = {k: v for k, v in summary.items() if k != "rounding"}
    return summary
