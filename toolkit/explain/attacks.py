"""FGSM/PGD on the margin max_{i != c} f_i - f_c, restricted to the pixels a domain lets move.

A successful attack on the box where F + {j} moves proves pixel j necessary: no explanation inside E = [n] \\ F
can drop j (the counterexample stays inside the larger domain). Their count is FAME's lower bound size_min.
"""

from __future__ import annotations

import torch

from toolkit.explain.crown import margin_spec
from toolkit.explain.net import AffineNet


def _margin(net: AffineNet, points: torch.Tensor, spec: torch.Tensor) -> torch.Tensor:
    return (net(points) @ spec.T).amax(-1)


def max_margin_attack(net: AffineNet, x0: torch.Tensor, lower: torch.Tensor, upper: torch.Tensor,
                      moving: torch.Tensor, label: int, method: str = "pgd", steps: int = 20, restarts: int = 2,
                      generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Best (margin, point) per row of `moving` (B, n) bool; a margin > 0 is a real counterexample.

    Every row is attacked once per rival class i (ascent on f_i - f_c, which has a useful gradient everywhere,
    unlike the max over classes); the best real margin over rivals, restarts and steps is kept."""
    spec = margin_spec(net.n_classes, label)
    rivals = spec.shape[0]
    batch = moving.shape[0]
    moving = moving.repeat_interleave(rivals, 0)
    target = torch.arange(rivals).repeat(batch)
    lo = torch.where(moving, lower, x0)
    hi = torch.where(moving, upper, x0)
    width = hi - lo
    best_margin = _margin(net, x0.expand_as(lo), spec)
    best_point = x0.expand_as(lo).clone()
    starts = 1 if method == "fgsm" else restarts
    for start in range(starts):
        noise = torch.rand(lo.shape, dtype=lo.dtype, generator=generator)
        point = x0.expand_as(lo).clone() if start == 0 else lo + noise * width
        n_steps = 1 if method == "fgsm" else steps
        step = width if method == "fgsm" else 2.5 * width / steps
        for _ in range(n_steps):
            point = point.detach().requires_grad_(True)
            objective = (net(point) @ spec.T).gather(1, target[:, None]).sum()
            grad, = torch.autograd.grad(objective, point)
            with torch.no_grad():
                point = torch.minimum(torch.maximum(point + step * grad.sign(), lo), hi)
                margin = _margin(net, point, spec)
                better = margin > best_margin
                best_margin = torch.where(better, margin, best_margin)
                best_point[better] = point[better]
    best_margin, pick = best_margin.reshape(batch, rivals).max(1)
    best_point = best_point.reshape(batch, rivals, -1)[torch.arange(batch), pick]
    return best_margin.detach(), best_point.detach()


def necessary_features(net: AffineNet, x0: torch.Tensor, lower: torch.Tensor, upper: torch.Tensor,
                       free: torch.Tensor, label: int, method: str = "pgd", steps: int = 20, restarts: int = 2,
                       seed: int = 0) -> torch.Tensor:
    """(P,) bool: explanation pixels (not in `free`) that an attack proves necessary."""
    kept = (~free).nonzero().flatten()
    necessary = torch.zeros_like(free)
    if len(kept) == 0 or method == "none":
        return necessary
    rows = free.expand(len(kept), -1).clone()
    rows[torch.arange(len(kept)), kept] = True
    moving = rows[:, net.feature_of_input()]
    generator = torch.Generator().manual_seed(seed)
    margin, _ = max_margin_attack(net, x0, lower, upper, moving, label, method, steps, restarts, generator)
    necessary[kept[margin > 0]] = True
    return necessary
