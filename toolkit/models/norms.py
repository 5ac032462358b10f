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

    An RMSNorm's output u = N(x) always lies on an ellipsoid: mean((u / scale)²) = a², a = rms(x) / sqrt(ms(x) + eps)
    ≈ 1, whatever x. The target t = u + shift has an exact pre-image only on it, so the target taken is the point y of
    the ellipsoid nearest to t (Euclidean, in the residual stream: y_i = t_i·s_i² / (s_i² + μ), μ by bisection), and
    x' = ρ·y / scale its exact pre-image (ρ = sqrt(ms(x) + eps): x's mean square kept, channels the norm
    zeroes left as they were). Exact when t is on the
    ellipsoid (shift = 0 included); otherwise the part of the shift the norm cannot produce is dropped: the component
    along the ellipsoid's normal u / scale², and what lies in channels of small |scale| (moving those would shrink
    every other channel, since the input's rms normalises all of them). A LayerNorm (centred too) takes the target's
    projection along its ray instead (x's mean and spread kept)."""
    x = x.float()
    scale = effective_scale(norm, info)
    bias = getattr(norm, "bias", None)
    with torch.no_grad():
        u = norm(x.to(norm.weight.dtype if scale is not None else x.dtype)).float()
    target = u + shift.float() - (bias.detach().float() if bias is not None else 0.0)
    if scale is None:
        scale = torch.ones(x.shape[-1])
    dead = scale.abs() < 1e-6 * scale.abs().max().clamp_min(1e-30)  # channels the norm zeroes cannot move
    safe = torch.where(dead, torch.ones_like(scale), scale)
    if info.kind == "layernorm":
        y = torch.where(dead, torch.zeros_like(target), target / safe)
        centre, y = x.mean(-1, keepdim=True), y - y.mean(-1, keepdim=True)
        spread = (x - centre).square().mean(-1, keepdim=True).sqrt()
        return centre + y * spread / y.square().mean(-1, keepdim=True).sqrt().clamp_min(1e-30) - x
    size = (torch.where(dead, torch.zeros_like(u), u - (bias.detach().float() if bias is not None else 0.0)) / safe)
    y = nearest_on_ellipsoid(torch.where(dead, torch.zeros_like(target), target).double(),
                             torch.where(dead, torch.zeros_like(scale), scale).double(),
                             size.double().square().mean(-1))
    # on the live channels u / scale = x / ρ, ρ = sqrt(ms(x) + eps); x' = ρ·y / scale there and x elsewhere has x's
    # mean square (y is on the ellipsoid), so its ρ is x's and N(x') = y
    live_x = torch.where(dead, torch.zeros_like(x), x).square().sum(-1, keepdim=True)
    rho = (live_x / size.square().sum(-1, keepdim=True).clamp_min(1e-30)).sqrt()
    return torch.where(dead, x, rho * y.float() / safe) - x


def nearest_on_ellipsoid(t: torch.Tensor, s: torch.Tensor, level: torch.Tensor, steps: int = 200) -> torch.Tensor:
    """Rows y nearest to rows t with mean((y / s)²) = level (channels with s = 0 held at 0): y = t·s² / (s² + μ),
    μ > −min s² found by bisection on the decreasing mean(t²·s² / (s² + μ)²)."""
    s2 = s.square()
    live = s2 > 0

    def excess(mu):
        return (t.square() * s2 / (s2 + mu[:, None]).square()).where(live, 0.0).mean(-1) - level

    low = torch.full_like(level, -float(s2[live].min()) * (1 - 1e-12))
    high = ((t.square() * s2).mean(-1).sqrt() / level.sqrt().clamp_min(1e-300)).clamp_min(0.0) + 1e-12
    for _ in range(steps):
        mid = (low + high) / 2
        above = excess(mid) > 0
        low, high = torch.where(above, mid, low), torch.where(above, high, mid)
    return (t * s2 / (s2 + ((low + high) / 2)[:, None])).where(live, 0.0)
