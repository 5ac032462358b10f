"""Perplexity with one decoder block in memory (`eval ppl --set onload=true`): the embeddings, final norm and head
are loaded once, every window's hidden states enter block 0, then block i is read from the safetensors shards, every
window goes through it, and it is freed; the final norm and the head score the windows at the end. The same windows,
the same block calls and the same head as the resident evaluation (toolkit/eval/perplexity.py), so the same numbers.

Host memory: the parts outside the blocks + one block + every window's hidden states (windows × max_length × hidden
in the compute dtype; --max-windows bounds it)."""

from __future__ import annotations

import torch

from toolkit.core.errors import BadInputError


@torch.no_grad()
def perplexity_onloaded(lazy, ids: torch.Tensor, max_length: int = 512, stride: int | None = None,
                        device: str = "cpu", max_windows: int | None = None, progress=None,
                        probe=None, bos: int | None = None) -> dict:
    """{ppl, nll, tokens, blocks} of a `toolkit.models.lazy.LazyModel`, block by block (`bos` as `perplexity`)."""
    from toolkit.eval.perplexity import summarize, window_nll, window_plan, with_bos
    from toolkit.nn.onload_stats import BlockStream

    plan = window_plan(ids, max_length, stride, max_windows, bos is not None)
    norm, head = _final_parts(lazy)
    stream = BlockStream(lazy, device, probe)
    # windows share a length but for the last one: one capture (hidden states, block args/kwargs) per length
    positions: dict[int, list[int]] = {}
    for position, (begin, end, _) in enumerate(plan):
        positions.setdefault(end - begin, []).append(position)
    groups = [stream.windows(torch.stack([with_bos(ids[plan[i][0]:plan[i][1]], bos) for i in members]))
              for members in positions.values()]
    stream.run(groups, progress=progress)
    hidden = {}
    for members, group in zip(positions.values(), groups):
        hidden.update(zip(members, group.hidden))
    total_nll, total_tokens = 0.0, 0
    for position, (begin, end, score_from) in enumerate(plan):
        logits = _logits(lazy, norm, head, hidden.pop(position).to(device))
        nll, tokens = window_nll(logits, with_bos(ids[begin:end], bos).to(device), score_from)
        total_nll += nll
        total_tokens += tokens
    return {**summarize(total_nll, total_tokens), "blocks": len(lazy.layers)}


def _final_parts(lazy):
    """(final norm, output head) of the model, found by its view; an architecture without them, or one that
    transforms the logits after the head (soft-capping, a logit scale), is refused."""
    from toolkit.models import archs

    norm = lazy.view.final_norm
    head = lazy.view.lm_head
    transforms = archs.logit_transforms(lazy.config)
    if transforms:
        raise BadInputError(f"onload=true perplexity applies the final norm and the head only; "
                            f"{lazy.config.model_type} also applies {', '.join(transforms)} to its logits",
                            "drop onload=true")
    if norm is None or head is None:
        raise BadInputError(f"onload=true perplexity needs a final norm and an output head; "
                            f"{lazy.config.model_type} has {'no final norm' if norm is None else 'no head'}",
                            "drop onload=true")
    if getattr(lazy.config, "model_type", "") in ("opt",) and getattr(lazy.config, "word_embed_proj_dim", None) \
            not in (None, getattr(lazy.config, "hidden_size", None)):
        raise BadInputError("onload=true perplexity does not cover OPT's projected output", "drop onload=true")
    return norm, head


def _logits(lazy, norm, head, hidden: torch.Tensor) -> torch.Tensor:
    """[len, vocab] float32 logits of one window's last hidden states, as the model's forward computes them."""
    logits = head(norm(hidden.unsqueeze(0) if hidden.ndim == 2 else hidden))
    cap = getattr(lazy.config, "final_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return logits.float()[0]
