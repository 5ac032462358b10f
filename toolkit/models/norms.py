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


def effective_scale(norm: nn.Module, info: NormInfo) -> torch.Tensor | None:
    """The per-channel scale the norm applies after normalising (offset + weight), float; None without a weight."""
    weight = getattr(norm, "weight", None)
    return None if weight is None else info.offset + weight.detach().float()


def preimage_shift(norm: nn.Module, info: NormInfo, x: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """The change of a norm's input x (rows) that moves its output by `shift`, as far as the norm allows.

    The norm's output u = N(x) always lies on its normalised set (an RMSNorm's u / scale has a fixed rms, a =
    rms(x) / sqrt(ms(x) + eps) ≈ 1; a LayerNorm's is also centred), so the target y = u + shift has an exact
    pre-image only when y lies on that set too. The returned x' − x is the exact pre-image of y's projection onto the
    set along its ray from the origin: x' ∝ y / scale with x's rms (and mean), so the eps term stays x's, and N(x') =
    a · y / rms(y / scale). Exact when shift = 0; otherwise N(x') − u is the shift less its radial component (the
    share along u / scale, which no input of the norm can produce) and a term second order in ‖shift‖ / ‖u‖."""
    x = x.float()
    scale = effective_scale(norm, info)
    bias = getattr(norm, "bias", None)
    with torch.no_grad():
        u = norm(x.to(norm.weight.dtype if scale is not None else x.dtype)).float()
    y = u + shift.float() - (bias.detach().float() if bias is not None else 0.0)
    if scale is not None:  # a channel the norm zeroes cannot be moved: leave it (no division by ~0)
        tiny = scale.abs() < 1e-6 * scale.abs().max().clamp_min(1e-30)
        y = torch.where(tiny, torch.zeros_like(y), y / torch.where(tiny, torch.ones_like(scale), scale))
    if info.kind == "layernorm":
        centre, y = x.mean(-1, keepdim=True), y - y.mean(-1, keepdim=True)
        spread = (x - centre).square().mean(-1, keepdim=True).sqrt()
        return centre + y * spread / y.square().mean(-1, keepdim=True).sqrt().clamp_min(1e-30) - x
    rms = x.square().mean(-1, keepdim=True).sqrt()
    return y * rms / y.square().mean(-1, keepdim=True).sqrt().clamp_min(1e-30) - x
