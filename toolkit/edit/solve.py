"""MEMIT's pure math: the closed-form multi-layer update, the δ norm projection, and Adam on the optimised rows.
"""

from __future__ import annotations

import logging

import torch

log = logging.getLogger("iclrkit.edit")


def closed_form_update(keys: torch.Tensor, resid: torch.Tensor, cov: torch.Tensor, lam: float) -> torch.Tensor:
    """ΔW = R Kᵀ (λC + K Kᵀ)⁻¹ in float64. keys K: (d_in, n), resid R: (d_out, n), cov C: (d_in, d_in).

    It is the minimiser of ‖ΔW K − R‖² + λ·tr(ΔW C ΔWᵀ): the new keys map to the residuals while the
    preserved keys (second moment C) move as little as possible."""
    K, R, C = keys.double(), resid.double(), cov.double()
    A = lam * C + K @ K.t()
    return torch.linalg.solve(A, K @ R.t()).t()  # A symmetric: (A⁻¹ K Rᵀ)ᵀ = R Kᵀ A⁻¹


def project_norm(delta: torch.Tensor, max_norm: torch.Tensor) -> torch.Tensor:
    """Rows of δ scaled down to ‖δ_i‖ ≤ max_norm_i (unchanged when already inside)."""
    norms = delta.norm(dim=-1, keepdim=True)
    scale = torch.clamp(max_norm.unsqueeze(-1) / norms.clamp_min(1e-12), max=1.0)
    return delta * scale


class MaskedAdam:
    """Adam over the rows of one tensor, where each row is an independent problem with its own step count:
    rows outside `active` are neither moved nor counted, so batching requests equals optimising each alone."""

    def __init__(self, shape, lr: float, betas=(0.9, 0.999), eps: float = 1e-8, device="cpu"):
        self.lr, self.betas, self.eps = lr, betas, eps
        self.m = torch.zeros(shape, device=device)
        self.v = torch.zeros(shape, device=device)
        self.t = torch.zeros(shape[0], device=device)

    @torch.no_grad()
    def step(self, param: torch.Tensor, grad: torch.Tensor, active: torch.Tensor) -> None:
        b1, b2 = self.betas
        a = active.unsqueeze(-1)
        self.t += active.float()
        self.m = torch.where(a, b1 * self.m + (1 - b1) * grad, self.m)
        self.v = torch.where(a, b2 * self.v + (1 - b2) * grad * grad, self.v)
        t = self.t.clamp_min(1).unsqueeze(-1)
        m_hat, v_hat = self.m / (1 - b1 ** t), self.v / (1 - b2 ** t)
        param.sub_(torch.where(a, self.lr * m_hat / (v_hat.sqrt() + self.eps), torch.zeros_like(param)))
