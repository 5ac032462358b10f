"""Perplexity with strided windows (the Hugging Face protocol): each token is scored once, with up to
`max_length - stride` tokens of left context carried over from the previous window."""

from __future__ import annotations

import math

import torch

from toolkit.core.errors import BadInputError


@torch.no_grad()
def perplexity(model, ids: torch.Tensor, max_length: int = 512, stride: int | None = None,
               device: str = "cpu", max_windows: int | None = None, progress=None) -> dict:
    """{ppl, nll, tokens}: mean negative log-likelihood over scored tokens (natural log) and its exp."""
    if ids.ndim != 1:
        raise BadInputError("perplexity expects a 1-D sequence of token ids")
    if ids.numel() < 2:
        raise BadInputError("evaluation text is shorter than two tokens")
    stride = stride or max_length
    if not 0 < stride <= max_length:
        raise BadInputError(f"stride must be in (0, max_length={max_length}], got {stride}")
    starts = list(range(0, ids.numel() - 1, stride))
    if max_windows:
        starts = starts[:max_windows]
    total_nll, total_tokens, previous_end = 0.0, 0, 0
    for begin in (progress(starts, total=len(starts), description="ppl") if progress else starts):
        end = min(begin + max_length, ids.numel())
        window = ids[begin:end].unsqueeze(0).to(device)
        logits = model(window).logits.float()[0, :-1]
        targets = window[0, 1:]
        score_from = max(previous_end - begin - 1, 0)
        nll = torch.nn.functional.cross_entropy(logits[score_from:], targets[score_from:], reduction="sum")
        total_nll += nll.item()
        total_tokens += targets.numel() - score_from
        previous_end = end
        if end == ids.numel():
            break
    mean = total_nll / max(total_tokens, 1)
    if not math.isfinite(mean):
        raise BadInputError("perplexity is not finite: the model produced NaN/Inf logits")
    return {"ppl": math.exp(mean), "nll": mean, "tokens": total_tokens}
