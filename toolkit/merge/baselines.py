"""Weight-space merging baselines the paper compares against: averaging, task arithmetic, TIES (the padded
average of different sizes is `average` over `projection.lay_out`).

Task arithmetic: Ilharco et al., "Editing Models with Task Arithmetic", ICLR 2023 (θ = θ_base + λ Σ τ_i).
TIES: Yadav et al., "TIES-Merging", NeurIPS 2023 (trim to the top-k% magnitudes, elect a sign per entry by the
summed trimmed values, average only the agreeing entries, θ = θ_base + λ τ_merged).
"""

from __future__ import annotations

import torch

from toolkit.core.errors import require


def normalise_weights(weights: list[float] | None, n: int) -> list[float]:
    weights = [1.0 / n] * n if weights is None else list(weights)
    require(len(weights) == n, f"{len(weights)} merge weights for {n} models")
    require(all(w >= 0 for w in weights) and sum(weights) > 0, "merge weights must be >= 0 and not all zero")
    total = sum(weights)
    return [w / total for w in weights]


def check_shapes(states: list[dict[str, torch.Tensor]]) -> None:
    """Every state has the shapes of the first (same-size models), else one line naming the tensor."""
    for name, tensor in states[0].items():
        for other in states[1:]:
            require(other[name].shape == tensor.shape,
                    f"'{name}' has shapes {tuple(tensor.shape)} and {tuple(other[name].shape)}: models of "
                    "different sizes", hint="use `iclrkit merge padded` or `iclrkit merge latent run`")


def average(states: list[dict[str, torch.Tensor]], weights: list[float] | None = None) -> dict[str, torch.Tensor]:
    check_shapes(states)
    weights = normalise_weights(weights, len(states))
    return {name: average_tensor([s[name] for s in states], weights) for name in states[0]}


def average_tensor(tensors: list[torch.Tensor], weights: list[float], dtype: torch.dtype | None = None):
    """One tensor of `average`: Σ w_i·t_i in float64 (weights already normalised), cast to `dtype` (default: the
    first tensor's); a non-float tensor is the first model's."""
    if not tensors[0].is_floating_point():
        return tensors[0].clone()
    return sum(w * t.double() for w, t in zip(weights, tensors)).to(dtype or tensors[0].dtype)


def task_vectors(states: list[dict[str, torch.Tensor]], base: dict[str, torch.Tensor]) -> list[dict]:
    check_shapes(states + [base])
    return [{n: s[n].double() - base[n].double() for n in base if base[n].is_floating_point()} for s in states]


def task_arithmetic(states: list[dict[str, torch.Tensor]], base: dict[str, torch.Tensor],
                    scaling: float = 1.0, weights: list[float] | None = None) -> dict[str, torch.Tensor]:
    """θ_base + λ Σ τ_i, or with per-model `weights` (mergekit's task_arithmetic) θ_base + λ Σ w_i τ_i."""
    check_shapes(states + [base])
    if weights is not None:
        require(len(weights) == len(states), f"{len(weights)} merge weights for {len(states)} models")
    return {n: task_arithmetic_tensor([s[n] for s in states], base[n], scaling, weights) for n in base}


def task_arithmetic_tensor(tensors: list[torch.Tensor], base: torch.Tensor, scaling: float = 1.0,
                           weights: list[float] | None = None, dtype: torch.dtype | None = None) -> torch.Tensor:
    """One tensor of `task_arithmetic`, in float64 (one tensor's task vectors at a time), cast to `dtype`
    (default: the base's); a non-float tensor is the base's."""
    if not base.is_floating_point():
        return base.clone()
    taus = [t.double() - base.double() for t in tensors]
    if weights is not None:
        taus = [w * v for w, v in zip(weights, taus)]
    return (base.double() + scaling * sum(taus)).to(dtype or base.dtype)


def ties(states: list[dict[str, torch.Tensor]], base: dict[str, torch.Tensor], density: float = 0.2,
         scaling: float = 1.0, weights: list[float] | None = None, densities: list[float] | None = None,
         normalize: bool = True) -> dict[str, torch.Tensor]:
    """TIES; with per-model `weights` / `densities` as mergekit's ties: the sign is elected on the weighted trimmed
    τ (a zero sum counts as +), and the agreeing weighted τ are summed and, with `normalize`, divided by their
    summed weights."""
    densities = ties_densities(len(states), density, densities, weights)
    check_shapes(states + [base])
    return {n: ties_tensor([s[n] for s in states], base[n], densities, scaling, weights, normalize) for n in base}


def ties_densities(n: int, density: float, densities: list[float] | None, weights: list[float] | None):
    """The per-model densities TIES uses, checked (and the weights' count)."""
    densities = list(densities) if densities is not None else [density] * n
    require(len(densities) == n, f"{len(densities)} TIES densities for {n} models")
    for value in densities:
        require(0.0 < value <= 1.0, f"TIES density must be in (0, 1], got {value}")
    if weights is not None:
        require(len(weights) == n, f"{len(weights)} merge weights for {n} models")
    return densities


def ties_tensor(tensors: list[torch.Tensor], base: torch.Tensor, densities: list[float], scaling: float = 1.0,
                weights: list[float] | None = None, normalize: bool = True,
                dtype: torch.dtype | None = None) -> torch.Tensor:
    """One tensor of `ties` (`densities` per model, from `ties_densities`), cast to `dtype` (default: the base's)."""
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
