"""Perplexity with strided windows (the Hugging Face protocol): each token is scored once, with up to
`max_length - stride` tokens of left context carried over from the previous window."""

from __future__ import annotations

import math

import torch

from toolkit.core.errors import BadInputError


def window_plan(ids: torch.Tensor, max_length: int = 512, stride: int | None = None,
                max_windows: int | None = None, bos: bool = False) -> list[tuple[int, int, int]]:
    """(begin, end, score_from) of each window: tokens ids[begin:end], of whose targets those from `score_from` on
    are scored (the earlier ones are context the previous window already scored). With `bos` every window is fed
    after a BOS token (`with_bos`): its first token is a target too, and max_length counts the BOS."""
    if ids.ndim != 1:
        raise BadInputError("perplexity expects a 1-D sequence of token ids")
    if ids.numel() < 2:
        raise BadInputError("evaluation text is shorter than two tokens")
    if bos:
        if max_length < 2:
            raise BadInputError(f"max_length must leave room for BOS and a token, got {max_length}")
        max_length -= 1
        stride = min(stride or max_length, max_length)
    stride = stride or max_length
    if not 0 < stride <= max_length:
        raise BadInputError(f"stride must be in (0, max_length={max_length}], got {stride}")
    starts = list(range(0, ids.numel() - 1, stride))
    if max_windows:
        starts = starts[:max_windows]
    windows, previous_end = [], 0
    for begin in starts:
        end = min(begin + max_length, ids.numel())
        windows.append((begin, end, max(previous_end - begin - (0 if bos else 1), 0)))
        previous_end = end
        if end == ids.numel():
            break
    return windows


def with_bos(window: torch.Tensor, bos: int | None) -> torch.Tensor:
    """The window as the model is fed it: after the BOS token when the tokenizer adds one."""
    if bos is None:
        return window
    return torch.cat([torch.tensor([bos], dtype=window.dtype, device=window.device), window])


def window_nll(logits: torch.Tensor, window: torch.Tensor, score_from: int) -> tuple[float, int]:
    """(summed NLL, scored tokens) of one window from its logits [len, vocab] (float32)."""
    targets = window[1:]
    nll = torch.nn.functional.cross_entropy(logits[:-1][score_from:], targets[score_from:], reduction="sum")
    return nll.item(), targets.numel() - score_from


def summarize(total_nll: float, total_tokens: int) -> dict:
    mean = total_nll / max(total_tokens, 1)
    if not math.isfinite(mean):
        raise BadInputError("perplexity is not finite: the model produced NaN/Inf logits")
    return {"ppl": math.exp(mean), "nll": mean, "tokens": total_tokens}


@torch.no_grad()
def perplexity(model, ids: torch.Tensor, max_length: int = 512, stride: int | None = None,
               device: str = "cpu", max_windows: int | None = None, progress=None, bos: int | None = None) -> dict:
    """{ppl, nll, tokens}: mean negative log-likelihood over scored tokens (natural log) and its exp. `bos`: the
    tokenizer's BOS id (`toolkit.models.tokens.bos_id`), fed before every window."""
    plan = window_plan(ids, max_length, stride, max_windows, bos is not None)
    total_nll, total_tokens = 0.0, 0
    for begin, end, score_from in (progress(plan, total=len(plan), description="ppl") if progress else plan):
        window = with_bos(ids[begin:end], bos).to(device)
        nll, tokens = window_nll(model(window.unsqueeze(0)).logits.float()[0], window, score_from)
        total_nll += nll
        total_tokens += tokens
    return summarize(total_nll, total_tokens)
