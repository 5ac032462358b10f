"""compressed-tensors `pack-quantized` export of a weight-only INT model (W4A16; symmetric, per channel or grouped),
the format llm-compressor writes and transformers / vLLM load directly.

Per quantized linear P (weights out × in), as `compressed_tensors.compressors.pack_quantized` defines them:
  P.weight_packed  int32 [out, ⌈in·b/32⌉]  unsigned codes (code + 2^{b−1}) densely packed LSB-first: element i
                   of a row occupies bits i·b … i·b+b−1 of the row's bit stream (4 bits: 8 codes per word,
                   element 0 in the lowest nibble); the row is zero-padded to a multiple of 32 elements
  P.weight_scale   float32 [out, 1] (channel) or [out, in/g] (group)
  P.weight_shape   int64 [2] = (out, in)
Symmetric grids need no zero point. Pruned weights are code 0 (stored as 8 for 4 bits): sparsity costs nothing and
is reproduced exactly. `config.json` gets `quantization_config` with the fields `ModelCompressor.update_config`
writes (version, quant_method, sparsity_config, transform_config, and the `QuantizationConfig` dump).

Offline rotations are already in the weights. The online rotation before down_proj (rotated models) is an exact
Hadamard only where one is constructed for the width (else (D·H_p) ⊗ B, and files written before 2026-12-03 always
the latter), so it is not written in the format's transform config: those down_proj linears are folded (W·Q_intᵀ) and kept unquantized, stored float32 so the reload is exact,
and listed in `ignore`; the model card says so. Models with quantized activations or KV cache are refused: the
engines would run them with 16-bit activations, a different model from the one iclrkit evaluated.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from toolkit.core.errors import BadInputError
from toolkit.export.quantized import QuantizedModel
from toolkit.models.experts import disk_name, expert_disk_names

WEIGHTS = "model.safetensors"
SCHEMA_VERSION = "0.20.1"  # the compressed-tensors release whose schema this writer follows (and was tested against)


def check_exportable(q: QuantizedModel) -> None:
    if any(slot.kind == "conv1d" for slot in q.view.slots(0)):
        raise BadInputError(f"{q.view.model_type} stores its linears as Conv1D: not supported by the "
                            "compressed-tensors format (it targets nn.Linear)", "use the packed export for GPT-2")
    blocker = q.view.traits.compressed_tensors_blocker
    if blocker:
        raise BadInputError(f"compressed-tensors export of {q.view.model_type}: {blocker}",
                            "use the packed or dense export")
    a_bits, kv_bits = int(q.metadata.get("a_bits", 16)), int(q.metadata.get("kv_bits", 16))
    if a_bits < 16 or kv_bits < 16:
        raise BadInputError(f"compressed-tensors export is weight-only (W{q.bits}A16); this model quantizes "
                            f"activations to {a_bits} bits and the KV cache to {kv_bits} bits, which transformers "
                            "and vLLM would not run (they would serve a different, 16-bit-activation model); "
                            "such models keep iclrkit's packed format",
                            "serve packed/ with iclrkit (eval ppl / eval tasks --model RUN/packed)")
    if not 2 <= q.bits <= 8:
        raise BadInputError(f"compressed-tensors pack-quantized stores 1..8-bit integers, got {q.bits} bits")
    groups = {grid.group_size for grid in q.linears.values()}
    if len(groups) > 1:
        raise BadInputError(f"mixed group sizes {sorted(groups, key=str)} need one config group each; not supported")
    for path, grid in q.linears.items():
        if grid.group_size and grid.codes.shape[1] % grid.group_size:
            raise BadInputError(f"{path}: {grid.codes.shape[1]} input columns are not a multiple of the group size "
                                f"{grid.group_size} (compressed-tensors groups are whole)")


def pack_int32(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Signed codes [rows, cols] → int32 [rows, ⌈cols·bits/32⌉], the compressed-tensors dense packing."""
    rows, cols = codes.shape
    unsigned = (codes.to(torch.int16) + (1 << (bits - 1))).numpy().astype(np.uint8)
    padded = np.zeros((rows, -(-cols // 32) * 32), dtype=np.uint8)
    padded[:, :cols] = unsigned
    bit_planes = np.unpackbits(padded[..., None], axis=-1, bitorder="little")[..., :bits]  # [rows, cols, bits]
    stream = np.packbits(bit_planes.reshape(rows, -1), axis=-1, bitorder="little")  # LSB-first bytes
    words = stream.view("<u4")[:, :-(-cols * bits // 32)]
    return torch.from_numpy(np.ascontiguousarray(words).view(np.int32))


def unpack_int32(packed: torch.Tensor, bits: int, cols: int) -> torch.Tensor:
    """Inverse of `pack_int32` (signed int8 codes)."""
    stream = packed.numpy().astype("<i4").view(np.uint8)
    planes = np.unpackbits(stream, axis=-1, bitorder="little")[:, :cols * bits].reshape(packed.shape[0], cols, bits)
    unsigned = (planes.astype(np.int16) << np.arange(bits, dtype=np.int16)).sum(-1)
    return torch.from_numpy((unsigned - (1 << (bits - 1))).astype(np.int8))


def quantization_config(q: QuantizedModel, ignore: list[str]) -> dict:
    group = next(iter(q.linears.values())).group_size if q.linears else None
    weights = {"num_bits": q.bits, "type": "int", "symmetric": True, "group_size": group,
               "strategy": "group" if group else "channel", "dynamic": False}
    try:
        import compressed_tensors

        version = compressed_tensors.__version__
    except ImportError:
        version = SCHEMA_VERSION
    return {"version": version, "quant_method": "compressed-tensors", "sparsity_config": {}, "transform_config": {},
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": None,
                                          "output_activations": None, "format": None}},
            "kv_cache_scheme": None, "format": "pack-quantized", "quantization_status": "compressed",
            "global_compression_ratio": None, "ignore": ignore, "moe_sparsity_config": None}


def _folded_down_proj(q: QuantizedModel) -> dict[str, torch.Tensor]:
    """Linears whose input the model rotates online (down_proj; o_proj with the cross-head rotation) → W·Qᵀ
    (float64 product, stored float32)."""
    folded = {}
    for name, module in q.model.named_modules():
        online = getattr(module, "iclrkit_online_rotation", None)
        if online is not None and name in q.linears:
            folded[name] = (module.weight.data.double().cpu() @ online.matrix().t()).float()
    return folded


def _disk_names(q: QuantizedModel, path: str, rows: int) -> list[tuple[str, slice]]:
    """Checkpoint module names a quantized slot is written under (one expert of a fused tensor: its per-expert
    tensors, as the format and vLLM name them; Mixtral's gate_up_proj[e] is w1 + w3), each with its rows."""
    _, slot = q.view.resolve(path)
    if slot.kind != "expert":
        return [(disk_name(q.view.model_type, path), slice(None))]
    fused = q.view.param_name(path)
    return expert_disk_names(q.view.model_type, fused, slot.expert, rows)


def _put_packed(tensors: dict, name: str, codes: torch.Tensor, scales: torch.Tensor, bits: int) -> None:
    tensors[f"{name}.weight_packed"] = pack_int32(codes.contiguous(), bits)
    tensors[f"{name}.weight_scale"] = scales.float().contiguous()
    tensors[f"{name}.weight_shape"] = torch.tensor(list(codes.shape), dtype=torch.int64)


def save_compressed_tensors(q: QuantizedModel, out: Path, card: dict | None = None) -> dict:
    """Write the directory; returns what it holds (quantized / float linears, bytes)."""
    from safetensors.torch import save_file

    from toolkit.export.card import write_card

    check_exportable(q)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    folded = _folded_down_proj(q)
    tensors, quantized = _tensors(q, folded)
    save_file(tensors, str(out / WEIGHTS), metadata={"format": "pt"})
    ignore = sorted({name for name, module in q.model.named_modules()
                     if isinstance(module, torch.nn.Linear) and name not in quantized})
    config = q.model.config.to_dict()
    config["quantization_config"] = quantization_config(q, ignore)
    config.pop("iclrkit", None)
    config["iclrkit"] = {**{k: v for k, v in q.metadata.items() if k != "rotation"},
                         "rotation": q.metadata.get("rotation"), "export": "compressed-tensors",
                         "unquantized_linears": ignore}
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True, default=str))
    generation = getattr(q.model, "generation_config", None)
    if generation is not None:
        generation.save_pretrained(out)
    if q.tokenizer is not None:
        q.tokenizer.save_pretrained(out)
    summary = {"format": "compressed-tensors pack-quantized", "quantized_linears": len(quantized),
               "float_linears": ignore, "folded_down_proj": len(folded),
               "size_mb": round((out / WEIGHTS).stat().st_size / 1e6, 3)}
    write_card(out, "compressed-tensors", q, summary, card or {})
    return summary


def _tensors(q: QuantizedModel, folded: dict) -> tuple[dict[str, torch.Tensor], list[str]]:
    """(every tensor of the checkpoint under its checkpoint name, the quantized linears): packed codes + scales +
    shape per quantized linear (per expert for fused experts), folded linears in float32, the rest as stored."""
    tensors: dict[str, torch.Tensor] = {}
    quantized, stored = [], set()  # quantized linears (in-memory names); state-dict names written packed
    model_type = q.view.model_type
    for path, grid in q.linears.items():
        if path in folded:
            continue
        for name, rows in _disk_names(q, path, grid.codes.shape[0]):
            _put_packed(tensors, name, grid.codes[rows], grid.scales[rows], q.bits)
        quantized.append(path)
        stored.add(q.view.param_name(path))
    for path, weight in folded.items():
        tensors[f"{disk_name(model_type, path)}.weight"] = weight.contiguous()
    tie = bool(getattr(q.model.config, "tie_word_embeddings", False))
    seen = set()
    for name, tensor in q.model.state_dict().items():
        if name in stored or name.rsplit(".", 1)[0] in folded:
            continue
        if tensor.data_ptr() in seen or (tie and name == "lm_head.weight"):
            continue
        seen.add(tensor.data_ptr())
        value = tensor.detach().cpu()
        if value.is_floating_point() and q.dense_dtype is not None:
            value = value.to(q.dense_dtype)
        tensors[disk_name(model_type, name)] = value.contiguous()
    return tensors, quantized
