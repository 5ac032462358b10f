"""The float64 tensor math of the weight-space baselines the paper compares against: averaging, task arithmetic,
TIES (the padded average of different sizes is `average` over `projection.lay_out`). The registered methods
(toolkit/merge/methods/) call these per tensor; the per-model lists are checked once per merge
(toolkit.merge.common.check_config).

Task arithmetic: Ilharco et al., "Editing Models with Task Arithmetic", ICLR 2023 (θ = θ_base + λ Σ τ_i).
TIES: Yadav et al., "TIES-Merging", NeurIPS 2023 (trim to the top-k% magnitudes, elect a sign per entry by the
summed trimmed values, average only the agreeing entries, θ = θ_base + λ τ_merged).
"""

from __future__ import annotations

import torch

from toolkit.core.errors import require


def normalise_weights(weights: list[float] | None, n: int) -> list[float]:
    """The weights divided by their sum (uniform 1/n when None)."""
    weights = [1.0 / n] * n if weights is None else list(weights)
    total = sum(weights)
    return [w / total for w in weights]


def check_shapes(states: list[dict[str, torch.Tensor]]) -> None:
    """Every state has the shapes of the first (same-size models), else one line naming the tensor."""
    for name, tensor in states[0].items():
        for other in states[1:]:
            require(other[name].shape == tensor.shape,
                    f"'{name}' has shapes {tuple(tensor.shape)} and {tuple(other[name].shape)}: models of "
                    "different sizes", hint="use `iclrkit merge padded` or `iclrkit merge latent run`")


def average_tensor(tensors: list[torch.Tensor], weights: list[float], dtype: torch.dtype | None = None):
    """One tensor of `average`: Σ w_i·t_i in float64 (weights already normalised), cast to `dtype` (default: the
    first tensor's); a non-float tensor is the first model's."""
    if not tensors[0].is_floating_point():
        return tensors[0].clone()
    return sum(w * t.double() for w, t in zip(weights, tensors)).to(dtype or tensors[0].dtype)


def task_arithmetic_tensor(tensors: list[torch.Tensor], base: torch.Tensor, scaling: float = 1.0,
                           weights: list[float] | None = None, dtype: torch.dtype | None = None) -> torch.Tensor:
    """θ_base + λ Σ τ_i, or with per-model `weights` (mergekit's task_arithmetic) θ_base + λ Σ w_i τ_i, in float64
    (one tensor's task vectors at a time), cast to `dtype` (default: the base's); a non-float tensor is the base's."""
    if not base.is_floating_point():
        return base.clone()
    taus = [t.double() - base.double() for t in tensors]
    if weights is not None:
        taus = [w * v for w, v in zip(weights, taus)]
    return (base.double() + scaling * sum(taus)).to(dtype or base.dtype)


def ties_tensor(tensors: list[torch.Tensor], base: torch.Tensor, densities: list[float], scaling: float = 1.0,
                weights: list[float] | None = None, normalize: bool = True,
                dtype: torch.dtype | None = None) -> torch.Tensor:
    """TIES on one tensor (`densities` per model), cast to `dtype` (default: the base's). With per-model `weights`
    as mergekit's ties: the sign is elected on the weighted trimmed τ (a zero sum counts as +), and the agreeing
    weighted τ are summed and, with `normalize`, divided by their summed weights."""
    if not base.is_floating_point():
        return base.clone()
    stacked = torch.stack([trim_top_k(t.double() - base.double(), d) for t, d in zip(tensors, densities)])
    if weights is not None:
        w = torch.tensor(weights, dtype=stacked.dtype).view(-1, *[1] * (stacked.dim() - 1))
        weighted = stacked * w
        majority = torch.where(weighted.sum(0) >= 0, 1.0, -1.0).to(stacked.dtype)
        agree = torch.sign(weighted) == majority
        tau = (weighted * agree).sum(0)
        if normalize:
            divisor = (w * agree).sum(0)
            tau = tau / torch.where(divisor == 0, torch.ones_like(divisor), divisor)
        return (base.double() + scaling * tau).to(dtype or base.dtype)
    sign = torch.sign(stacked.sum(0))
    agree = (torch.sign(stacked) == sign) & (stacked != 0)
    count = agree.sum(0).clamp(min=1)
    tau = (stacked * agree).sum(0) / count
    return (base.double() + scaling * tau).to(dtype or base.dtype)


def trim_top_k(tau: torch.Tensor, density: float) -> torch.Tensor:
    """Keep the int(density·n) entries of largest magnitude (at least one), zero the rest: the count the official
    TIES code and mergekit keep."""
    flat = tau.reshape(-1)
    if density >= 1.0:
        return tau.clone()
    keep = max(1, int(density * flat.numel()))
    index = flat.abs().topk(keep).indices
    out = torch.zeros_like(flat)
    out[index] = flat[index]
    return out.view_as(tau)
