"""Packed `compress obr` outputs on the INT4 kernels: the stored codes of one linear, and a packed directory loaded as
a model whose quantized linears are toolkit.ops.packed_linear.PackedInt4Linear. Lives in compress (it reads compress's file
format) so the kernel layer (toolkit.ops) imports no technique."""

from __future__ import annotations

import numpy as np
import torch

from toolkit.core.errors import BadInputError
from toolkit.ops.packed_linear import PackedInt4Linear


def codes_from_packed(tensors: dict[str, np.ndarray], shape: tuple[int, int], bits: int) -> torch.Tensor:
    """Integer codes [N, K] of one linear stored by toolkit.compress.packed (bitmask or dense nibble stream)."""
    from toolkit.compress.packed import unpack_linear_codes

    if bits > 4:
        raise BadInputError(f"INT4 kernels need ≤ 4-bit weights, the packed model has {bits}")
    return torch.from_numpy(unpack_linear_codes(tensors, shape, bits).astype(np.int16))


def load_packed_int4(directory, a_bits: int = 8, sparse: str = "auto", with_tokenizer: bool = True,
                     device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32):
    """A `compress obr` packed directory as a model whose quantized linears are PackedInt4Linear, moved once to
    `device` (the kernels of that device run). a_bits 16 selects the W4A16 weight-only kernel (on CUDA it needs
    dtype float16 or bfloat16). Rotations and the rest come from toolkit.compress.packed.load_packed; only the
    quantized linears are swapped."""
    from toolkit.compress.packed import load_packed, read_packed

    config, tensors = read_packed(directory)
    model, tokenizer = load_packed(directory, dtype=dtype, with_tokenizer=with_tokenizer)
    for path, shape in config["linears"].items():
        parts = {key: tensors[f"{path}.{key}"] for key in ("qweight", "scales", "mask") if f"{path}.{key}" in tensors}
        scales = parts["scales"]
        if (scales.ndim == 2 and scales.shape[1] > 1) or any(key.startswith(f"{path}.") and "g_idx" in key
                                                              for key in tensors):
            raise BadInputError(f"{path}: the INT4 kernels take one scale per output channel; this packed model has "
                                "grouped scales", "load it with load_packed (dequantized) or compress per channel")
        codes = codes_from_packed(parts, tuple(shape), config["bits"])
        module = model.get_submodule(path)
        bias = getattr(module, "bias", None)
        replacement = PackedInt4Linear.from_codes(codes, torch.from_numpy(parts["scales"].copy()), bias, a_bits, sparse)
        # keep the online rotation (a forward pre-hook on down_proj) that load_packed installed
        replacement._forward_pre_hooks.update(module._forward_pre_hooks)
        if hasattr(module, "iclrkit_online_rotation"):
            replacement.iclrkit_online_rotation = module.iclrkit_online_rotation
        parent_path, _, leaf = path.rpartition(".")
        setattr(model.get_submodule(parent_path) if parent_path else model, leaf, replacement)
    return model.to(device), tokenizer
