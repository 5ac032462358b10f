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
                    scaling: float = 1.0) -> dict[str, torch.Tensor]:
    taus = task_vectors(states, base)
    return {n: (base[n].double() + scaling * sum(t[n] for t in taus)).to(base[n].dtype) if n in taus[0]
            else base[n].clone() for n in base}


def ties(states: list[dict[str, torch.Tensor]], base: dict[str, torch.Tensor], density: float = 0.2,
         scaling: float = 1.0) -> dict[str, torch.Tensor]:
    require(0.0 < density <= 1.0, f"TIES density must be in (0, 1], got {density}")
    taus = task_vectors(states, base)
    merged = {}
    for name, tensor in base.items():
        if name not in taus[0]:
            merged[name] = tensor.clone()
            continue
        stacked = torch.stack([trim_top_k(t[name], density) for t in taus])
        sign = torch.sign(stacked.sum(0))
        agree = (torch.sign(stacked) == sign) & (stacked != 0)
        count = agree.sum(0).clamp(min=1)
        tau = (stacked * agree).sum(0) / count
        merged[name] = (tensor.double() + scaling * tau).to(tensor.dtype)
    return merged


def trim_top_k(tau: torch.Tensor, density: float) -> torch.Tensor:
    """Keep the round(density·n) entries of largest magnitude (ties broken by position), zero the rest."""
    flat = tau.reshape(-1)
    keep = max(1, round(density * flat.numel()))
    index = flat.abs().topk(keep).indices
    out = torch.zeros_like(flat)
    out[index] = flat[index]
    return out.view_as(tau)
