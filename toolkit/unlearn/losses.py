"""Pure math of the unlearning objectives: NPO, the annealed probe weight, SAM and gradient decoupling."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from toolkit.nn.logprobs import sequence_logprob  # noqa: F401 - the objectives' shared log-likelihood


def mean_nll(logits: torch.Tensor, input_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Token-averaged next-token cross-entropy over non-pad tokens (the retain / GDR loss)."""
    targets = input_ids[:, 1:].masked_fill(mask[:, 1:] == 0, -100)
    return F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.shape[-1]), targets.reshape(-1),
                           ignore_index=-100)


def npo_loss(logp_model: torch.Tensor, logp_ref: torch.Tensor, beta: float) -> torch.Tensor:
    """NPO (Zhang et al. 2024): -(2/β)·E log σ(-β·(log π_θ(y|x) - log π_ref(y|x))) on sequence log-likelihoods.

    The official PRISM/MUSE code subtracts logits element-wise instead (technique note pitfall 4)."""
    return -(2.0 / beta) * F.logsigmoid(-beta * (logp_model - logp_ref)).mean()


def probe_weight(gamma_max: float, epoch: int, epochs: int) -> float:
    """γ(p) = γ_max·exp(-5(1-p)²), p = epoch/(E-1): small early, γ_max in the last epoch (p = 1 when E = 1).

    Evaluated inside every training step; the official code sets it in a Trainer hook that never runs, so the
    probe term is silently zero there (pitfall 1)."""
    p = 1.0 if epochs <= 1 else min(max(epoch / (epochs - 1), 0.0), 1.0)
    return gamma_max * math.exp(-5.0 * (1.0 - p) ** 2)


def sam_perturbation(grads: list[torch.Tensor | None], rho: float) -> list[torch.Tensor | None]:
    """ε = ρ·g/‖g‖ with ‖g‖ the global L2 norm over all tensors (Foret et al. 2021)."""
    norm = torch.sqrt(sum((g.float() ** 2).sum() for g in grads if g is not None))
    scale = rho / (norm + 1e-12)
    return [None if g is None else g * scale for g in grads]


def project_out(g_forget: torch.Tensor, g_retain: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Remove from one tensor's forget gradient its component along the retain gradient (unconditionally)."""
    work = torch.promote_types(g_forget.dtype, torch.float32)  # bf16 gradients are projected in fp32
    f, r = g_forget.to(work), g_retain.to(work)
    return (f - ((f * r).sum() / ((r * r).sum() + eps)) * r).to(g_forget.dtype)


def decouple(forget_grads: list[torch.Tensor | None],
             retain_grads: list[torch.Tensor | None]) -> list[torch.Tensor | None]:
    """Per-parameter-tensor projection of the forget gradient orthogonal to the retain gradient."""
    return [gf if gf is None or gr is None else project_out(gf, gr) for gf, gr in zip(forget_grads, retain_grads)]


def fgsm_probe_loss(probe: torch.nn.Module, features: torch.Tensor, labels: torch.Tensor, epsilon: float,
                    alpha: float, l1: float) -> torch.Tensor:
    """Robust probe objective: CE(f(h), y) + α·CE(f(h + ε·sign ∇_h CE), y) + λ₁‖φ‖₁."""
    h = features.detach().requires_grad_(True)
    clean = F.cross_entropy(probe(h), labels)
    (grad,) = torch.autograd.grad(clean, h, retain_graph=True)
    adversarial = F.cross_entropy(probe(features.detach() + epsilon * grad.sign()), labels)
    penalty = sum(p.abs().sum() for p in probe.parameters())
    return clean + alpha * adversarial + l1 * penalty


def rmu_loss(h_forget: torch.Tensor, control: torch.Tensor, h_retain: torch.Tensor, h_retain_frozen: torch.Tensor,
             alpha: float, forget_mask: torch.Tensor, retain_mask: torch.Tensor) -> torch.Tensor:
    """RMU (Li et al. 2024): ‖h(x_f) − c·u‖² + α‖h(x_r) − h_frozen(x_r)‖², means over non-pad tokens."""
    def masked_mse(a, b, mask):
        per_token = ((a.float() - b.float()) ** 2).mean(-1)
        return (per_token * mask).sum() / mask.sum().clamp(min=1)

    return masked_mse(h_forget, control.expand_as(h_forget), forget_mask) + \
        alpha * masked_mse(h_retain, h_retain_frozen, retain_mask)
