"""MUSE-style metrics: ROUGE-L (rouge-score, toolkit.eval.metrics.rouge_l, re-exported), Min-k% membership score,
PrivLeak."""

from __future__ import annotations

import torch

from toolkit.eval.metrics import auroc, rouge_l  # noqa: F401 - rouge_l re-exported for MUSE callers


def lcs_length(a: list[str], b: list[str]) -> int:
    """Length of the longest common subsequence (dynamic programming, O(len(a)·len(b)) time, O(len(b)) memory)."""
    if not a or not b:
        return 0
    previous = [0] * (len(b) + 1)
    for x in a:
        current = [0]
        for j, y in enumerate(b, start=1):
            current.append(previous[j - 1] + 1 if x == y else max(previous[j], current[j - 1]))
        previous = current
    return previous[-1]


def min_k_score(token_logprobs: torch.Tensor, k: float) -> float:
    """Min-k% Prob (Shi et al. 2024): mean of the lowest k-fraction of token log-probabilities (higher = member)."""
    flat = token_logprobs.flatten().float()
    count = max(1, int(round(k * flat.numel())))
    return float(torch.topk(flat, count, largest=False).values.mean())


def mia_auc(member_scores: list[float], nonmember_scores: list[float]) -> float:
    """AUC of telling members (forget) from non-members (holdout): ~1 memorised, ~0.5 never seen."""
    return auroc(list(member_scores) + list(nonmember_scores), [1] * len(member_scores) + [0] * len(nonmember_scores))


def privleak(auc: float, auc_reference: float) -> float:
    """MUSE PrivLeak: (AUC − AUC_retrain)/AUC_retrain × 100; ~0 is ideal, >0 under-, <0 over-unlearned."""
    return (auc - auc_reference) / auc_reference * 100.0
