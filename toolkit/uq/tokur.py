"""TokUR — token-level uncertainty for LLM reasoning via low-rank weight perturbation (ICLR 2026).

Paper: https://arxiv.org/abs/2505.11737 · official code: https://github.com/Wang-ML-Lab/TokUR (GPU, forked vLLM).

M perturbed copies of the model, W⁽ᵐ⁾ = W₀ + U_r E⁽ᵐ⁾ on the attention projections (U_r: top-r left singular
vectors of W₀, E ~ N(0, σ²)), teacher-force one generated response. With p_m the next-token distribution of copy m:
  total TU_t = H[mean_m p_m], aleatoric AU_t = mean_m H[p_m], epistemic EU_t = TU_t − AU_t (mutual information).
The perturbation is applied by forward hooks adding (x Eᵀ) U_rᵀ to a projection's output: no weight copies and
no M× generation cost. σ is chosen by binary search so the NLL of held-out anchor answers changes by at most 1%
(the TFB rule).
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass

import torch
from torch import nn

from toolkit.models.view import view_of


# ------------------------------------------------------------------------------------------ decomposition math
def entropy(probs: torch.Tensor) -> torch.Tensor:
    """Shannon entropy (nats) over the last axis, with 0·log 0 = 0."""
    return torch.special.entr(probs).sum(-1)


def decompose(log_probs: torch.Tensor) -> dict[str, torch.Tensor]:
    """(M, T, V) log-probabilities of M model samples → per-token total, aleatoric and epistemic uncertainty.
    EU is a mutual information (≥ 0); float rounding can make TU − AU a hair negative, so it is clipped at 0.
    Computed a few positions at a time (float64 chunks of ≤ 8 MB, which stay in cache: with a large vocabulary about
    twice as fast as whole-tensor passes); each reduction runs over the same elements as on the whole tensor."""
    samples, positions, vocab = log_probs.shape
    step = max(1, (1 << 20) // max(1, samples * vocab))
    totals, per_copy = [], []
    for start in range(0, max(positions, 1), step):
        probs = log_probs[:, start:start + step].double()
        probs.exp_()
        totals.append(entropy(probs.mean(0)))
        per_copy.append(entropy(probs))  # (M, step): averaged over M below, as one tensor
    total, aleatoric = torch.cat(totals), torch.cat(per_copy, dim=1).mean(0)
    return {"total": total, "aleatoric": aleatoric, "epistemic": (total - aleatoric).clamp_min(0.0)}


def aggregate(values: torch.Tensor, how: str = "mean") -> float:
    """Response-level score from token-level values: mean | sum | max."""
    if values.numel() == 0:
        return 0.0
    return float({"mean": values.mean, "sum": values.sum, "max": values.max}[how]())


def best_of_n(scores: list[float]) -> int:
    """Index of the candidate with the lowest uncertainty (the first on ties)."""
    return min(range(len(scores)), key=lambda i: scores[i])


# ------------------------------------------------------------------------------------------ low-rank perturbation
@dataclass
class Projection:
    module: nn.Module
    basis: torch.Tensor  # (out, r): top-r left singular vectors of the (out, in) weight


def attention_projections(model: nn.Module, rank: int) -> list[Projection]:
    """The attention projections (q, k, v or fused qkv, and o) of every block with their rank-r bases."""
    view = view_of(model)
    projections = []
    for index, block in enumerate(view.blocks):
        layout = view.layout(index)
        inside = [s for g in layout.groups if g.roles & {"attn_in", "attn_out"} for s in g.slots
                  if layout.attention and s.module.startswith(layout.attention + ".")]
        for slot in inside:
            module = block.get_submodule(slot.module)
            weight = slot.weight(block).detach().float()  # (out, in)
            left, _, _ = torch.linalg.svd(weight, full_matrices=False)
            projections.append(Projection(module, left[:, :min(rank, left.shape[1])].contiguous()))
    return projections


def draw_noise(projections: list[Projection], sigma: float, generator: torch.Generator) -> list[torch.Tensor]:
    """E (r, in) ~ N(0, σ²) per projection; the weight change is ΔW = U_r E."""
    noises = []
    for p in projections:
        fan_in = _fan_in(p.module)
        noises.append(torch.randn(p.basis.shape[1], fan_in, generator=generator) * sigma)
    return noises


def _fan_in(module: nn.Module) -> int:
    return module.in_features if isinstance(module, nn.Linear) else module.weight.shape[0]  # Conv1D is (in, out)


@contextlib.contextmanager
def perturbed(projections: list[Projection], noises: list[torch.Tensor]):
    """Add x Eᵀ U_rᵀ to each projection's output (= a forward pass with W₀ + U_r E); hooks always removed.
    A noise of shape (B, r, in) perturbs row b of a batch of B sequences with its own E_b: B perturbed copies in
    one forward pass."""
    handles = []
    try:
        for p, noise in zip(projections, noises, strict=True):
            def hook(module, inputs, output, basis=p.basis, noise=noise):
                x = inputs[0]
                noise_t = noise.to(x.device, x.dtype).transpose(-1, -2)
                delta = (x @ noise_t) @ basis.to(x.device, x.dtype).T
                return output + delta
            handles.append(p.module.register_forward_hook(hook))
        yield
    finally:
        for handle in handles:
            handle.remove()


@torch.no_grad()
def response_log_probs(model: nn.Module, prompt_ids: torch.Tensor, response_ids: torch.Tensor,
                       rows: int = 1) -> torch.Tensor:
    """(T, V) next-token log-probabilities at the positions that predict each response token; (rows, T, V) when
    rows > 1 (the sequence repeated, e.g. under a batched `perturbed`). Where the model takes `logits_to_keep`, the
    LM head runs on the response positions only (the same numbers: the head is applied position by position)."""
    count = len(response_ids)
    ids = torch.cat([prompt_ids, response_ids]).unsqueeze(0).expand(rows, -1).to(next(model.parameters()).device)
    from toolkit.models.adapters import takes_logits_to_keep

    if count and takes_logits_to_keep(model):
        logits = model(ids, logits_to_keep=count + 1).logits[:, :-1].float()
    else:
        logits = model(ids).logits[:, len(prompt_ids) - 1:-1].float()
    logits = logits.log_softmax(-1).cpu()
    return logits[0] if rows == 1 else logits


def token_uncertainty(model: nn.Module, projections: list[Projection], prompt_ids: torch.Tensor,
                      response_ids: torch.Tensor, sigma: float, samples: int, seed: int) -> dict[str, torch.Tensor]:
    """Per-token TU/AU/EU of one response under `samples` perturbed models (the M copies run as one batch of M
    rows, each with its own draw). σ = 0 means every copy is the unperturbed model, so one pass is the whole
    ensemble and EU is exactly 0."""
    if sigma == 0:
        return decompose(response_log_probs(model, prompt_ids, response_ids).unsqueeze(0))
    generator = torch.Generator().manual_seed(seed)
    draws = [draw_noise(projections, sigma, generator) for _ in range(samples)]  # copy by copy, as drawn before
    with perturbed(projections, [torch.stack(per_copy) for per_copy in zip(*draws)]):  # all copies in one batch
        log_probs = response_log_probs(model, prompt_ids, response_ids, rows=samples)
    return decompose(log_probs.reshape(samples, len(response_ids), -1))


def mean_response_nll(model: nn.Module, anchors: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
    """Mean NLL per answer token of (prompt ids, answer ids) pairs. Only the answer counts: the prompt's tokens
    (e.g. random operands) are not what the model predicts, and their large NLL would dilute the 1% rule."""
    total, count = 0.0, 0
    for prompt_ids, answer_ids in anchors:
        log_probs = response_log_probs(model, prompt_ids, answer_ids)
        total -= float(log_probs.gather(-1, answer_ids.unsqueeze(-1)).sum())
        count += len(answer_ids)
    return total / max(count, 1)


def calibrate_sigma(model: nn.Module, projections: list[Projection],
                    anchors: list[tuple[torch.Tensor, torch.Tensor]], threshold: float = 0.01,
                    iterations: int = 10, sigma_max: float = 1.0, seed: int = 0,
                    draws: int = 2) -> tuple[float, list[dict]]:
    """Largest σ (binary search) whose mean relative change of the answer NLL on the (prompt, answer) anchors,
    over `draws` noise draws, is ≤ `threshold`. Returns σ and the search trace."""
    base = mean_response_nll(model, anchors)

    def relative_change(sigma: float) -> float:
        generator = torch.Generator().manual_seed(seed)
        changes = []
        for _ in range(draws):
            with perturbed(projections, draw_noise(projections, sigma, generator)):
                changes.append(abs(mean_response_nll(model, anchors) - base) / base)
        return sum(changes) / len(changes)

    low, high, trace = 0.0, sigma_max, []
    for _ in range(iterations):
        middle = (low + high) / 2
        change = relative_change(middle)
        trace.append({"sigma": middle, "relative_nll_change": change})
        low, high = (middle, high) if change <= threshold else (low, middle)
    return low, trace


# ------------------------------------------------------------------------------------------ answers
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def extract_answer(text: str) -> str | None:
    """GSM8K final answer: the text after '####' if present, else the last number; commas dropped."""
    if "####" in text:
        text = text.split("####")[-1]
    numbers = _NUMBER.findall(text)
    if not numbers:
        return None
    value = numbers[-1].replace(",", "")
    return value.rstrip("0").rstrip(".") if "." in value else value
