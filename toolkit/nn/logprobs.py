"""Log-probabilities of given tokens under a causal LM's logits: the one implementation every technique uses
(unlearning losses and MIA scores, HF scoring, DeepRAG's DPO, edit metrics, TokUR). float32 softmax always."""

from __future__ import annotations

import torch


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log p(targets[..., t]) under logits[..., t, :] (already aligned: position t predicts targets[t])."""
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def next_token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """log p(input_ids[t + 1] | input_ids[≤ t]) for every t: shape [..., T - 1]."""
    return token_logprobs(logits[..., :-1, :], input_ids[..., 1:])


def sequence_logprob(logits: torch.Tensor, input_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sum over the non-pad next tokens (mask 1) of log p(token | prefix): one log-likelihood per sequence."""
    token = next_token_logprobs(logits, input_ids)
    return (token * mask[..., 1:].to(token.dtype)).sum(dim=-1)
