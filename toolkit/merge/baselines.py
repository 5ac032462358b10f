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


def _check_shapes(states: list[dict[str, torch.Tensor]]) -> None:
    for name, tensor in states[0].items():
        for other in states[1:]:
            require(other[name].shape == tensor.shape,
                    f"'{name}' has shapes {tuple(tensor.shape)} and {tuple(other[name].shape)}: models of "
                    "different sizes", hint="use `iclrkit merge padded` or `iclrkit merge latent run`")


def average(states: list[dict[str, torch.Tensor]], weights: list[float] | None = None) -> dict[str, torch.Tensor]:
    _check_shapes(states)
    weights = normalise_weights(weights, len(states))
    merged = {}
    for name, tensor in states[0].items():
        if not tensor.is_floating_point():
            merged[name] = tensor.clone()
            continue
        merged[name] = sum(w * s[name].double() for w, s in zip(weights, states)).to(tensor.dtype)
    return merged


def task_vectors(states: list[dict[str, torch.Tensor]], base: dict[str, torch.Tensor]) -> list[dict]:
    _check_shapes(states + [base])
    return [{n: s[n].double() - base[n].double() for n in base if base[n].is_floating_point()} for s in states]


def task_arithmetic(states: list[dict[str, torch.Tensor]], base: dict[str, torch.Tensor],
                    scaling: float = 1.0, weights: list[float] | None = None) -> dict[str, torch.Tensor]:
    """θ_base + λ Σ τ_i, or with per-model `weights` (mergekit's task_arithmetic) θ_base + λ Σ w_i τ_i."""
    taus = task_vectors(states, base)
    if weights is not None:
        require(len(weights) == len(taus), f"{len(weights)} merge weights for {len(taus)} models")
        taus = [{n: w * v for n, v in t.items()} for w, t in zip(weights, taus)]
    return {n: (base[n].double() + scaling * sum(t[n] for t in taus)).to(base[n].dtype) if n in taus[0]
            else base[n].clone() for n in base}


def ties(states: list[dict[str, torch.Tensor]], base: dict[str, torch.Tensor], density: float = 0.2,
         scaling: float = 1.0, weights: list[float] | None = None, densities: list[float] | None = None,
         normalize: bool = True) -> dict[str, torch.Tensor]:
    """TIES; with per-model `weights` / `densities` as mergekit's ties: the sign is elected on the weighted trimmed
    τ (a zero sum counts as +), and the agreeing weighted τ are summed and, with `normalize`, divided by their
    summed weights."""
    densities = list(densities) if densities is not None else [density] * len(states)
    require(len(densities) == len(states), f"{len(densities)} TIES densities for {len(states)} models")
    for value in densities:
        require(0.0 < value <= 1.0, f"TIES density must be in (0, 1], got {value}")
    taus = task_vectors(states, base)
    if weights is not None:
        require(len(weights) == len(taus), f"{len(weights)} merge weights for {len(taus)} models")
    merged = {}
    for name, tensor in base.items():
        if name not in taus[0]:
            merged[name] = tensor.clone()
            continue
        stacked = torch.stack([trim_top_k(t[name], d) for t, d in zip(taus, densities)])
        if weights is not None:
            w = torch.tensor(weights, dtype=stacked.dtype).view(-1, *[1] * (stacked.dim() - 1))
            weighted = stacked * w
            majority = torch.where(weighted.sum(0) >= 0, 1.0, -1.0).to(stacked.dtype)
            agree = torch.sign(weighted) == majority
            tau = (weighted * agree).sum(0)
            if normalize:
                divisor = (w * agree).sum(0)
                tau = tau / torch.where(divisor == 0, torch.ones_like(divisor), divisor)
            merged[name] = (tensor.double() + scaling * tau).to(tensor.dtype)
            continue
        sign = torch.sign(stacked.sum(0))
        agree = (torch.sign(stacked) == sign) & (stacked != 0)
        count = agree.sum(0).clamp(min=1)
        tau = (stacked * agree).sum(0) / count
        merged[name] = (tensor.double() + scaling * tau).to(tensor.dtype)
    return merged


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
