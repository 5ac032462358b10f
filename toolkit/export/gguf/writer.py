"""`save_gguf`: one GGUF Q4_0 file (metadata, vocabulary, tensors) and its README card; `check_exportable` refuses
what Q4_0 cannot hold before anything is written."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch

from toolkit.core.errors import BadInputError
from toolkit.export.gguf.checks import check_architecture
from toolkit.export.gguf.layouts import LAYOUTS
from toolkit.export.gguf.metadata import model_dims, write_metadata
from toolkit.export.gguf.q4_0 import BLOCK, ROUNDING, fp16_scales, q4_0_bytes
from toolkit.export.gguf.tensors import ModelTensors, Rows
from toolkit.export.gguf.vocab import write_tokenizer
from toolkit.export.quantized import QuantizedModel

log = logging.getLogger("iclrkit")


def check_exportable(q: QuantizedModel) -> None:
    check_architecture(q.model.config)
    if q.bits != 4:
        raise BadInputError(f"GGUF Q4_0 holds 4-bit weights; this model has {q.bits}-bit weights")
    a_bits, kv_bits = int(q.metadata.get("a_bits", 16)), int(q.metadata.get("kv_bits", 16))
    if a_bits < 16 or kv_bits < 16:
        raise BadInputError(f"GGUF Q4_0 is weight-only; this model quantizes activations to {a_bits} bits and the KV "
                            f"cache to {kv_bits} bits, which llama.cpp would not reproduce; such models keep "
                            "iclrkit's packed format", "serve packed/ with iclrkit (eval ppl / eval tasks)")
    for path, grid in q.linears.items():
        if grid.codes.shape[1] % BLOCK:
            raise BadInputError(f"{path}: {grid.codes.shape[1]} input columns are not a multiple of {BLOCK} (Q4_0)")
        if grid.group_size is not None and grid.group_size % BLOCK:
            raise BadInputError(f"{path}: group size {grid.group_size} is not a multiple of {BLOCK} (Q4_0)")
    experts = [q.view.layout(i).experts is not None for i in range(len(q.view))]
    if any(experts) and not all(experts):
        raise BadInputError("--export gguf: blocks with and without experts; llama.cpp's loaders expect experts in "
                            "every block")


def save_gguf(q: QuantizedModel, out: Path, filename: str = "model-Q4_0.gguf", card: dict | None = None) -> dict:
    """Write OUT/model-Q4_0.gguf and OUT/README.md; returns what the file holds."""
    import gguf

    from toolkit.export.card import write_card

    check_exportable(q)
    arch = check_architecture(q.model.config)
    layout = LAYOUTS[arch]
    dims = model_dims(q, arch)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    target = out / filename
    writer = gguf.GGUFWriter(str(target), arch)
    notes = write_metadata(writer, q, arch, layout, dims)
    if q.tokenizer is not None:
        write_tokenizer(writer, q.tokenizer, int(q.model.get_input_embeddings().weight.shape[0]))
    model_tensors = ModelTensors(q, arch, layout, dims)
    tensors, skipped = model_tensors.collect()
    counts = _write_tensors(writer, tensors, half_ok=q.dense_dtype == torch.float16
                            and int(q.metadata.get("embed_bits", 16)) >= 16)
    notes += _tensor_notes(model_tensors, skipped)
    for note in notes:
        log.warning("gguf: %s", note)
    summary = {"format": "GGUF Q4_0 (llama.cpp)", "architecture": arch, "file": target.name, "tensors": counts,
               "float_ffn_down": len(model_tensors.folded), "float_type": "F32", "rounding": ROUNDING,
               "size_mb": round(target.stat().st_size / 1e6, 3)}
    if notes:
        summary["notes"] = notes
    write_card(out, "gguf", q, summary, {**(card or {}), "notes": [*(card or {}).get("notes", []), *notes]},
               target=target)
    return summary


def _write_tensors(writer, tensors: list[tuple[str, Rows]], half_ok: bool) -> dict[str, int]:
    """Every tensor into the file (Q4_0 blocks, or F16 where a float16 model's dense tensor is exact in it, else F32),
    then the file itself; returns how many of each type."""
    import gguf

    counts = {"Q4_0": 0, "F32": 0, "F16": 0}
    for gguf_name, rows in tensors:
        if rows.codes is not None:
            flat_codes = rows.codes.reshape(-1, rows.codes.shape[-1])
            scales = fp16_scales(gguf_name, rows.scales.reshape(-1, rows.scales.shape[-1]), flat_codes)
            raw = q4_0_bytes(flat_codes, scales).reshape(*rows.codes.shape[:-1], -1)
            writer.add_tensor(gguf_name, raw, raw_dtype=gguf.GGMLQuantizationType.Q4_0)
            counts["Q4_0"] += 1
            continue
        array = np.ascontiguousarray(rows.value, dtype=np.float32)
        half = half_ok and array.ndim == 2 and not rows.float32  # float16 in a packed file: F16 is exact
        writer.add_tensor(gguf_name, array.astype(np.float16) if half else array)
        counts["F16" if half else "F32"] += 1
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return counts


def _tensor_notes(model_tensors: ModelTensors, skipped: list[str]) -> list[str]:
    notes = []
    if skipped:
        notes.append(f"{len(skipped)} tensors outside the text decoder are not written (e.g. {skipped[0]}); "
                     "llama.cpp serves a vision tower as a separate mmproj file")
    c, has_q_norm, arch = model_tensors.c, model_tensors.has_q_norm, model_tensors.arch
    if c != 1.0:
        notes.append(f"attention scale: transformers uses query_pre_attn_scalar^-1/2, llama.cpp's '{arch}' another "
                     f"constant; the ratio {c:.6g} is folded into "
                     f"{'the q-norm weights' if has_q_norm else 'the q rows (Q4_0 scales d = fp16(c * s))'}")
    return notes
