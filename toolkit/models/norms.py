"""Norms measured, not named: a LayerNorm ignores a constant added to every feature, an RMSNorm does not; an RMSNorm
whose zeroed weight still passes the normalised input scales by (1 + w) (Gemma), else by w."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn


@dataclass
class NormInfo:
    path: str  # block-relative ("" prefix for model-level norms: full path)
    kind: str  # "rmsnorm" | "layernorm"
    offset: float  # effective scale = offset + weight (Gemma's (1 + w): 1.0; plain: 0.0)
    has_bias: bool



def norm_info(path: str, norm: nn.Module) -> NormInfo:
    """Kind and scale convention of a norm, measured: a LayerNorm ignores a constant added to every feature; an RMSNorm
    with a zeroed weight gives 0 (plain) or the normalised input ((1 + w), Gemma)."""
    weight = getattr(norm, "weight", None)
    bias = getattr(norm, "bias", None)
    width = weight.shape[-1] if weight is not None else None
    if width is None or weight.device.type == "meta":
        return NormInfo(path, "layernorm" if isinstance(norm, nn.LayerNorm) else "rmsnorm", 0.0, bias is not None)
    generator = torch.Generator().manual_seed(0)
    x = (torch.randn(3, width, generator=generator) * 4).to(device=weight.device, dtype=torch.float32)
    with torch.no_grad():
        dtype = weight.dtype
        xd = x.to(dtype)
        shifted = norm(xd + 3.0).float()
        plain = norm(xd).float()
        kind = "layernorm" if torch.allclose(shifted, plain, atol=5e-2, rtol=5e-2) else "rmsnorm"
        saved = weight.data.clone()
        saved_bias = bias.data.clone() if bias is not None else None
        try:
            weight.data.zero_()
            if bias is not None:
                bias.data.zero_()
            zeroed = norm(xd).float()
        finally:
            weight.data.copy_(saved)
            if bias is not None:
                bias.data.copy_(saved_bias)
    offset = 0.0 if zeroed.abs().max() < 1e-3 * max(plain.abs().max().item(), 1.0) else 1.0
    return NormInfo(path, kind, offset, bias is not None)
