"""Packed export: INT4 codes two per byte (only the kept weights), per-row float32 scales and a sparsity bitmask,
in one safetensors file whose header carries `quantization_config`; everything else is stored as float16.
`load_packed(dir)` rebuilds a runnable HF model (dequantized weights, online rotations re-installed).

Layout per quantized linear P (weights as out × in, row-major):
  P.qweight  uint8  codes + 2^{b−1} of the stored entries, two per byte for b ≤ 4 (one per byte otherwise)
  P.scales   float32 one per output row, or [out, ⌈in/g⌉] with grouped scales (`group_size` g in the config)
  P.g_idx    int32 [in], only for activation-ordered groups (GPTQ actorder=group): the group of each input column
  P.mask     uint8  np.packbits of the non-zero bitmask; present only when it saves space (> 25% zeros), and then
                    P.qweight holds only the entries the mask marks
Zeros need no code: a symmetric grid maps a pruned weight to code 0, so the bitmask is exactly "code ≠ 0".

With `embed_bits` 4 or 8 the token embeddings and the LM head (most of a small model's bytes once its linears are
INT4) are stored as E.qcodes (codes packed like the linears, no mask) + E.group_scales (float16, one per `group`
columns of a row); `round_vocab_matrices` puts the in-memory model on that grid first, so evaluation, the dense
export and the packed file agree.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from toolkit.compress.quant import WeightGrid, codes_of, fit_weight_scale, max_code
from toolkit.core.errors import BadInputError

WEIGHTS = "model.packed.safetensors"
FORMAT = "iclrkit-int-bitmask-v1"


def _unique_params(model) -> dict[str, torch.Tensor]:
    seen, out = set(), {}
    for name, tensor in model.state_dict().items():
        if tensor.data_ptr() in seen:
            continue
        seen.add(tensor.data_ptr())
        out[name] = tensor
    return out


def vocab_matrix_names(view) -> list[str]:
    """State-dict names of the token embedding and LM head weights (one name per storage)."""
    modules = [view.embed_tokens, view.lm_head]
    by_ptr = {t.data_ptr(): n for n, t in _unique_params(view.model).items()}
    return list(dict.fromkeys(by_ptr[m.weight.data_ptr()] for m in modules if m is not None))


def quantize_groups(weight: torch.Tensor, bits: int, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric codes [rows, cols] and float16 scales [rows, ⌈cols/group⌉], each run of `group` columns of a row
    on its own MSE-clipped grid; codes × scales reproduce `dequantize_groups` exactly."""
    rows, cols = weight.shape
    padded = torch.nn.functional.pad(weight.float(), (0, -cols % group))
    pieces = padded.reshape(-1, group)
    scale = fit_weight_scale(pieces, bits).half().float().clamp_min(torch.finfo(torch.float16).tiny)
    codes = codes_of(pieces, scale, bits).reshape(rows, -1)[:, :cols]
    return codes.to(torch.int8), scale.reshape(rows, -1).half()


def dequantize_groups(codes: torch.Tensor, scales: torch.Tensor, group: int) -> torch.Tensor:
    expanded = scales.float().repeat_interleave(group, dim=1)[:, :codes.shape[1]]
    return codes.float() * expanded


@torch.no_grad()
def round_vocab_matrices(view, bits: int, group: int) -> dict[str, tuple]:
    """Put the embeddings and LM head on their grouped integer grid, in place; returns name → (codes, scales) for
    `save_packed` (re-fitting scales on already-rounded weights could pick another grid)."""
    params, grids = _unique_params(view.model), {}
    for name in vocab_matrix_names(view):
        grids[name] = quantize_groups(params[name], bits, group)
        params[name].copy_(dequantize_groups(*grids[name], group).to(params[name].dtype))
    return grids


def fp16_size_bytes(model) -> int:
    return sum(t.numel() * 2 for t in _unique_params(model).values() if t.is_floating_point())


def pack_codes(codes: np.ndarray, bits: int) -> np.ndarray:
    """Signed codes → unsigned (offset 2^{b−1}), two per byte (low nibble first) when b ≤ 4."""
    unsigned = (codes.astype(np.int16) + (max_code(bits) + 1)).astype(np.uint8)
    if bits > 4:
        return unsigned
    if unsigned.size % 2:
        unsigned = np.append(unsigned, np.uint8(max_code(bits) + 1))
    return (unsigned[0::2] | (unsigned[1::2] << 4)).astype(np.uint8)


def unpack_codes(packed: np.ndarray, count: int, bits: int) -> np.ndarray:
    if bits > 4:
        unsigned = packed[:count]
    else:
        unsigned = np.empty(packed.size * 2, dtype=np.uint8)
        unsigned[0::2], unsigned[1::2] = packed & 0x0F, packed >> 4
        unsigned = unsigned[:count]
    return unsigned.astype(np.int16) - (max_code(bits) + 1)


def _entry_scales(scale: torch.Tensor, columns: int, group_size: int | None,
                  g_idx: torch.Tensor | None) -> torch.Tensor:
    """[out, 1] for per-row scales, the scale of every entry [out, columns] for grouped ones."""
    scale = scale.float()
    if group_size is None:
        if scale.dim() == 2 and scale.shape[1] != 1:
            raise BadInputError("grouped scales without a group_size: cannot expand them")
        return scale.reshape(-1, 1)
    if scale.dim() != 2:
        raise BadInputError(f"grouped scales must be [out, groups], got shape {tuple(scale.shape)}")
    return WeightGrid(scale, group_size, None if g_idx is None else torch.as_tensor(g_idx).long()).per_column(columns)


def pack_linear(weight: torch.Tensor, scale: torch.Tensor, bits: int, group_size: int | None = None,
                g_idx: torch.Tensor | None = None) -> dict[str, np.ndarray]:
    """Codes + scales (+ bitmask, + g_idx) of one quantized linear. The weight must be its grid's value: in float32
    exactly codes × scale; in a narrower dtype (bfloat16/float16 models) codes × scale rounded to that dtype."""
    entry = _entry_scales(scale, weight.shape[1], group_size, g_idx)
    codes = codes_of(weight.float(), entry, bits)
    if not torch.equal((codes * entry).to(weight.dtype), weight):
        raise BadInputError("weight is not on its quantization grid; cannot pack it losslessly")
    flat = codes.to(torch.int16).numpy().reshape(-1)
    tensors = {"scales": scale.float().numpy()}
    if g_idx is not None:
        tensors["g_idx"] = torch.as_tensor(g_idx).to(torch.int32).numpy()
    nonzero = flat != 0
    if 1 - nonzero.mean() > 0.25:
        tensors["mask"] = np.packbits(nonzero)
        flat = flat[nonzero]
    tensors["qweight"] = pack_codes(flat, bits)
    return tensors


def unpack_linear_codes(tensors: dict[str, np.ndarray], shape: tuple[int, int], bits: int) -> np.ndarray:
    """Integer codes (rows, columns) of one packed linear, zeros restored from the bitmask when there is one."""
    rows, columns = shape
    count = rows * columns
    if "mask" in tensors:
        nonzero = np.unpackbits(tensors["mask"], count=count).astype(bool)
        codes = np.zeros(count, dtype=np.int16)
        codes[nonzero] = unpack_codes(tensors["qweight"], int(nonzero.sum()), bits)
    else:
        codes = unpack_codes(tensors["qweight"], count, bits)
    return codes.reshape(rows, columns)


def unpack_linear(tensors: dict[str, np.ndarray], shape: tuple[int, int], bits: int,
                  group_size: int | None = None) -> torch.Tensor:
    g_idx = torch.from_numpy(tensors["g_idx"].astype(np.int64)) if "g_idx" in tensors else None
    scale = _entry_scales(torch.from_numpy(tensors["scales"].copy()), shape[1], group_size, g_idx)
    return torch.from_numpy(unpack_linear_codes(tensors, shape, bits).astype(np.float32)) * scale


def _in_module_order(model, scales: dict) -> list[tuple[str, torch.Tensor]]:
    """(path, scale) in the model's module order (scales come in checkpoint order on --resume); a fused expert's
    slice ("...experts.down_proj[3]") sorts with its module, by path."""
    order = {name: i for i, (name, _) in enumerate(model.named_modules())}

    def key(item):
        module = item[0].split("[", 1)[0]
        while module and module not in order:
            module = module.rpartition(".")[0]
        return order.get(module, len(order)), item[0]

    return sorted(scales.items(), key=key)


def save_packed(view, tokenizer, out: Path, scales: dict[str, torch.Tensor], bits: int,
                metadata: dict, embed_bits: int = 16, embed_group: int = 64,
                vocab_grids: dict[str, tuple] | None = None, g_idx: dict[str, torch.Tensor] | None = None) -> dict:
    """Write the packed directory; returns measured sizes (MB) and the ratio to FP16. With embed_bits < 16 the
    vocab matrices are stored on `vocab_grids` (from `round_vocab_matrices`), or on grids fitted here. Grouped
    scales ([out, groups]) need `metadata["group_size"]`; `g_idx` maps linear paths to their column → group index
    (activation-ordered groups only)."""
    from safetensors.numpy import save_file

    model = view.model
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    quantized, shapes, tensors = {}, {}, {}
    group_size = metadata.get("group_size")
    for path, scale in _in_module_order(model, scales):  # the file does not depend on the order scales came in
        weight = view.weight(path)
        shapes[path] = list(weight.shape)
        packed = pack_linear(weight.detach().cpu(), scale.cpu(), bits, group_size if scale.dim() == 2 else None,
                             (g_idx or {}).get(path))
        for key, value in packed.items():
            tensors[f"{path}.{key}"] = value
        quantized[view.param_name(path)] = quantized.get(view.param_name(path), 0) + weight.numel()
    linear_bytes = sum(v.nbytes for v in tensors.values())
    grouped = {name: {"bits": embed_bits, "group": embed_group}
               for name in (vocab_matrix_names(view) if embed_bits < 16 else [])}
    for name, tensor in _unique_params(model).items():
        value = tensor.detach().cpu()
        if name in grouped:
            codes, group_scales = (vocab_grids or {}).get(name) or quantize_groups(value, embed_bits, embed_group)
            tensors[f"{name}.qcodes"] = pack_codes(codes.to(torch.int16).numpy().reshape(-1), embed_bits)
            tensors[f"{name}.group_scales"] = group_scales.numpy()
            grouped[name]["shape"] = list(value.shape)
        elif name not in quantized:
            tensors[name] = (value.half() if value.is_floating_point() else value).numpy()
    config = {"quant_method": "iclrkit", "format": FORMAT, "bits": bits, "linears": shapes,
              "grouped_matrices": grouped, **metadata}
    save_file(tensors, str(out / WEIGHTS), metadata={"quantization_config": json.dumps(config)})
    model.config.to_json_file(str(out / "config.json"))
    (out / "quantization_config.json").write_text(json.dumps(config, indent=2))
    if tokenizer is not None:
        tokenizer.save_pretrained(out)
    fp16_linear = 2 * sum(quantized.values())
    return {"packed_mb": round((out / WEIGHTS).stat().st_size / 1e6, 3),
            "packed_linear_mb": round(linear_bytes / 1e6, 3),
            "packed_linear_ratio_vs_fp16": round(linear_bytes / max(fp16_linear, 1), 4),
            "packed_ratio_vs_fp16": round((out / WEIGHTS).stat().st_size / max(fp16_size_bytes(model), 1), 4)}


def read_packed(directory: Path) -> tuple[dict, dict[str, np.ndarray]]:
    from safetensors import safe_open

    path = Path(directory) / WEIGHTS
    if not path.is_file():
        raise BadInputError(f"{directory} is not a packed iclrkit model (no {WEIGHTS})")
    with safe_open(str(path), framework="numpy") as handle:
        stored = (handle.metadata() or {}).get("quantization_config")
        tensors = {key: handle.get_tensor(key) for key in handle.keys()}  # noqa: SIM118 - safe_open is not a dict
    if stored is None:  # a tool rewrote the file without its metadata: the directory's copy of the config serves
        copy = Path(directory) / "quantization_config.json"
        if not copy.is_file():
            raise BadInputError(f"{path} has no quantization_config in its metadata and {copy.name} is missing",
                                "re-export the model with `iclrkit compress ... --set export=packed`")
        stored = copy.read_text()
    config = json.loads(stored)
    if config.get("format") != FORMAT:
        raise BadInputError(f"unknown packed format {config.get('format')!r}")
    return config, tensors


def load_packed(directory: str | Path, dtype=torch.float32, with_tokenizer: bool = True):
    """(model, tokenizer) from a packed directory: weights dequantized to `dtype`, online rotations re-installed."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from toolkit.models.view import view_of

    directory = Path(directory)
    config, tensors = read_packed(directory)
    model_config = AutoConfig.from_pretrained(str(directory))
    model = AutoModelForCausalLM.from_config(model_config, dtype=dtype).eval()
    view = view_of(model)
    packed_keys = {f"{p}.{key}" for p in config["linears"] for key in ("qweight", "scales", "mask", "g_idx")}
    dense = {k: _as_torch(v, dtype) for k, v in tensors.items() if k not in packed_keys}
    for name, spec in config.get("grouped_matrices", {}).items():
        rows, cols = spec["shape"]
        codes = unpack_codes(tensors[f"{name}.qcodes"], rows * cols, spec["bits"]).reshape(rows, cols)
        scales = torch.from_numpy(tensors[f"{name}.group_scales"].copy())
        dense.pop(f"{name}.qcodes"), dense.pop(f"{name}.group_scales")
        dense[name] = dequantize_groups(torch.from_numpy(codes), scales, spec["group"]).to(dtype)
    missing, unexpected = model.load_state_dict(dense, strict=False)
    quantized = {view.param_name(p) for p in config["linears"]}
    if unexpected or set(missing) - quantized - _tied_names(model):
        raise BadInputError(f"packed weights do not match the config: missing {sorted(set(missing) - quantized)[:3]}, "
                            f"unexpected {unexpected[:3]}")
    group_size = config.get("group_size")
    for path, shape in config["linears"].items():
        parts = {key: tensors[f"{path}.{key}"] for key in ("qweight", "scales", "mask", "g_idx")
                 if f"{path}.{key}" in tensors}
        grouped = group_size if parts["scales"].ndim == 2 else None
        view.set_weight(path, unpack_linear(parts, tuple(shape), config["bits"], grouped).to(dtype))
    rotation = config.get("rotation")
    if rotation:
        from toolkit.compress.rotation import install_online_rotations, online_rotations

        install_online_rotations(view, *online_rotations(rotation))
    tokenizer = None
    if with_tokenizer:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(directory))
    return model, tokenizer


def _as_torch(value: np.ndarray, dtype) -> torch.Tensor:
    tensor = torch.from_numpy(value.copy())
    return tensor.to(dtype) if tensor.is_floating_point() else tensor


def _tied_names(model) -> set[str]:
    ptrs: dict[int, list[str]] = {}
    for name, tensor in model.state_dict().items():
        ptrs.setdefault(tensor.data_ptr(), []).append(name)
    return {name for names in ptrs.values() if len(names) > 1 for name in names}
