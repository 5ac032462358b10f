"""The tensor math of the task-vector, spherical and stock merges (pure torch; no other import, so a benchmark can
load this file on its own). Every function computes in the dtype of the tensors it is given: float64 for iclrkit's
default numerics, the models' dtype (as mergekit 0.1.5 does, same order of operations) for `numerics: mergekit`.

Definitions (each pinned by a test against an independent reference written from the papers):
- sparsification of a task vector τ (n entries), keeping a `density` share:
  magnitude (TIES): the max(1, ⌊density·n⌋) largest |τ|; random (DARE): each entry with probability density;
  della (DELLA's MagPrune): within each row, the entry of magnitude rank r (0 = smallest, of m) is kept with
  probability density − ε + 2ε·r/(m−1); magnitude_outliers (breadcrumbs): the ⌊gamma·n⌋ largest and the
  n − ⌊density·n⌋ − ⌊gamma·n⌋ smallest |τ| dropped. With `rescale` the kept entries are scaled to τ's L1 norm.
- merge of the (weighted) sparsified τᵢ: their sum, or with sign consensus (TIES) the sum of the entries whose sign
  agrees with the sign of Σᵢ wᵢτᵢ (a zero sum counts as +); with `normalize` divided by the summed weights (of the
  agreeing models); θ = θ_base + λ·τ.
"""

from __future__ import annotations

import zlib

import torch

EPS = 1e-7


def generator(seed: int, name: str, model: int) -> torch.Generator:
    """The random stream of one model's task vector on one tensor: fixed by (seed, tensor name, model index), so a
    streamed and an in-memory merge, in any tensor order, draw the same drops."""
    return torch.Generator().manual_seed(zlib.crc32(f"{seed}:{name}:{model}".encode()))


def keep_draw(probs: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Bernoulli(probs) as 0/1 in probs' dtype: u < p with u uniform in float64 from `gen` (so the draw does not
    depend on the compute dtype)."""
    u = torch.rand(probs.shape, generator=gen, dtype=torch.float64)
    return (u < probs.double()).to(probs.dtype)


def rescaled(tau: torch.Tensor, mask: torch.Tensor, rescale: bool) -> torch.Tensor:
    """τ·mask, scaled back to τ's L1 norm when `rescale` (unless either norm is below 1e-7)."""
    masked = tau * mask
    if not rescale:
        return masked
    before, after = tau.abs().sum(), masked.abs().sum()
    if before < EPS or after < EPS:
        return masked
    return masked * (before / after)


def _work_dtype(tau: torch.Tensor, mergekit: bool) -> torch.dtype:
    """mergekit draws its CPU masks in float32 (bfloat16 stays); iclrkit in the compute dtype."""
    if mergekit and tau.dtype != torch.bfloat16:
        return torch.float32
    return tau.dtype


def magnitude(tau: torch.Tensor, density: float, rescale: bool = False) -> torch.Tensor:
    if density >= 1:
        return tau
    if density <= 0 or tau.numel() == 0:
        return torch.zeros_like(tau)
    keep = max(1, int(density * tau.numel()))
    w = tau.abs().reshape(-1)
    if w.dtype in (torch.float16, torch.bfloat16):
        w = w.float()
    mask = torch.zeros(tau.numel(), dtype=tau.dtype)
    mask[torch.argsort(w, descending=True)[:keep]] = 1
    return rescaled(tau, mask.reshape_as(tau), rescale)


def magnitude_outliers(tau: torch.Tensor, density: float, gamma: float, rescale: bool = False) -> torch.Tensor:
    if density >= 1:
        return tau
    n = tau.numel()
    target, top = int(density * n), int(gamma * n)
    bottom = max(0, n - target - top)
    w = tau.abs().reshape(-1)
    if w.dtype in (torch.float16, torch.bfloat16):
        w = w.float()
    order = torch.sort(w, descending=False).indices
    mask = torch.zeros(n, dtype=tau.dtype)
    mask[order[bottom:bottom + target]] = 1
    return rescaled(tau, mask.reshape_as(tau), rescale)


def random_drop(tau: torch.Tensor, density: float, gen: torch.Generator, rescale: bool = True,
                mergekit: bool = False) -> torch.Tensor:
    if density >= 1:
        return tau
    work = _work_dtype(tau, mergekit)
    mask = keep_draw(torch.full(tau.shape, density, dtype=work), gen)
    return rescaled(tau.to(work), mask, rescale).to(tau.dtype)


def della_magprune(tau: torch.Tensor, density: float, epsilon: float, gen: torch.Generator, rescale: bool = True,
                   mergekit: bool = False) -> torch.Tensor:
    if density >= 1:
        return tau
    if density <= 0:
        return torch.zeros_like(tau)
    if density + epsilon >= 1 or density - epsilon <= 0:
        raise ValueError(f"DELLA needs density ± epsilon in (0, 1), got {density} ± {epsilon}")
    work = _work_dtype(tau, mergekit)
    shape = tau.shape
    rows = tau.unsqueeze(0) if tau.dim() < 2 else tau
    ranks = torch.argsort(rows.abs(), dim=1, descending=False).argsort(dim=1).to(work) + 1
    low, high = ranks.min(dim=1, keepdim=True).values, ranks.max(dim=1, keepdim=True).values
    probs = (density - epsilon) + ((ranks - low) / (high - low)).clamp(0, 1) * 2 * epsilon
    mask = keep_draw(probs, gen).to(work)
    return rescaled(rows.to(work), mask, rescale).to(tau.dtype).reshape(shape)


def task_vector_merge(base: torch.Tensor, taus: list[torch.Tensor], weights: list[float], consensus: bool,
                      normalize: bool, scaling: float) -> torch.Tensor:
    """θ_base + λ·merge(wᵢ·τᵢ) (mergekit's generalized task arithmetic, same operations, in base's dtype)."""
    deltas = base.new_empty((len(taus), *base.shape))
    for index, tau in enumerate(taus):
        deltas[index] = tau
    w = torch.tensor(weights, dtype=deltas.dtype)
    while deltas.dim() > w.dim():
        w.unsqueeze_(-1)
    deltas.mul_(w)
    if consensus:
        sign = deltas.sign().to(base.dtype)
        majority = (deltas.sum(dim=0) >= 0).to(base.dtype) * 2 - 1
        agree = sign == majority
        mixed = (deltas * agree).sum(dim=0)
        divisor = (w * agree).sum(dim=0)
        divisor[divisor == 0] = 1
    else:
        mixed = deltas.sum(dim=0)
        divisor = w.sum(dim=0)
        divisor[divisor.abs() < 1e-8] = 1
    if normalize:
        mixed /= divisor
    if scaling != 1:
        mixed *= scaling
    return (base + mixed).to(base.dtype)


def linear(tensors: list[torch.Tensor], weights: list[float], normalize: bool, dtype: torch.dtype) -> torch.Tensor:
    """Σ wᵢθᵢ (/ Σ wᵢ with `normalize`) accumulated in `dtype` (mergekit's linear: float32 unless float64)."""
    w = torch.tensor(weights, dtype=dtype)
    result = torch.zeros_like(tensors[0], dtype=dtype)
    for tensor, coefficient in zip(tensors, w.unbind(0)):
        result.addcmul_(tensor, coefficient)
    if normalize:
        result.div_(w.sum())
    return result


SLERP_CHUNK = 1024 * 1024  # mergekit's scratch bound: columns per chunk = SLERP_CHUNK // rows


def slerp(t: float, v0: torch.Tensor, v1: torch.Tensor, dtype: torch.dtype, dot_threshold: float = 0.9995,
          eps: float = 1e-8) -> torch.Tensor:
    """Spherical interpolation of the flattened tensors v0 → v1 at t, computed in `dtype` and stored in v0's dtype;
    |cos| > dot_threshold falls back to linear interpolation (mergekit's slerp, same chunked operations)."""
    a, b = v0.reshape(1, -1), v1.reshape(1, -1)
    t = torch.tensor([[t]], dtype=dtype)
    if not a.shape[1]:
        return ((1 - t) * a + t * b).reshape(v0.shape).to(v0.dtype)
    chunk = max(1, SLERP_CHUNK // a.shape[0])
    spans = range(0, a.shape[1], chunk)
    norm_a = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(a[:, s:s + chunk].to(dtype), dim=1,
                                                                            keepdim=True) for s in spans]), dim=0)
    norm_b = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(b[:, s:s + chunk].to(dtype), dim=1,
                                                                            keepdim=True) for s in spans]), dim=0)
    norm_a = torch.where(norm_a > eps, norm_a, 1)
    norm_b = torch.where(norm_b > eps, norm_b, 1)
    dot = torch.stack([((a[:, s:s + chunk].to(dtype) / norm_a) * (b[:, s:s + chunk].to(dtype) / norm_b))
                       .sum(dim=1, keepdim=True) for s in spans]).sum(dim=0).clamp(-1, 1)
    straight = dot.abs() > dot_threshold
    theta = torch.acos(torch.where(straight, 0, dot))
    sin_theta = torch.sin(theta)
    coef_a = torch.where(straight, 1 - t, torch.sin((1 - t) * theta) / sin_theta)
    coef_b = torch.where(straight, t, torch.sin(t * theta) / sin_theta)
    result = torch.empty_like(a)
    for s in spans:
        result[:, s:s + chunk] = coef_a * a[:, s:s + chunk].to(dtype) + coef_b * b[:, s:s + chunk].to(dtype)
    return result.reshape(v0.shape)


def model_stock(base: torch.Tensor, tensors: list[torch.Tensor], filter_wise: bool = False) -> torch.Tensor:
    """Model Stock: t·mean(θᵢ) + (1 − t)·θ_base, t = k·cosθ / (1 + (k − 1)·cosθ) with cosθ the mean pairwise cosine
    of the task vectors (per tensor, or per row with `filter_wise`); t = 0 where the denominator vanishes."""
    shape = base.shape
    if filter_wise:
        w0, ws = (base.unsqueeze(0), [w.unsqueeze(0) for w in tensors]) if base.dim() == 1 else (base, tensors)
    else:
        w0, ws = base.reshape(-1), [w.reshape(-1) for w in tensors]
    offsets = [w - w0 for w in ws]
    cosines = []
    for i, a in enumerate(offsets):
        for b in offsets[i + 1:]:
            norms = torch.norm(a, dim=-1) * torch.norm(b, dim=-1)
            cosines.append(((a * b).sum(dim=-1) / norms.clamp(min=1e-6)).clamp(-1, 1))
    cos = torch.stack(cosines).mean(dim=0).unsqueeze(-1)
    k = len(ws)
    denominator = 1 + (k - 1) * cos
    singular = denominator.abs() < 1e-6
    t = torch.where(singular, torch.zeros_like(cos),
                    (k * cos) / torch.where(singular, torch.ones_like(denominator), denominator))
    return (t * (sum(ws) / k) + (1 - t) * w0).reshape(shape)
