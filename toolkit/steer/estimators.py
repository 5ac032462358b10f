"""The three direction estimators (pure math on activation matrices) and their split-half stability.

Reconstruction of "Inference-Time Personalized Safety Control via Paired Difference-in-Means Intervention"
(OpenReview VHiHVBNy1M; no official code). Rows of `undesired` / `neutral` are residual-stream activations
h_l(x) of shape (n, d); for the paired estimators row i of both matrices comes from the same topic.
"""

from __future__ import annotations

import torch

from toolkit.core.errors import require

METHODS = ("pcms", "ums", "ilcs")


def pcms_direction(undesired: torch.Tensor, neutral: torch.Tensor) -> torch.Tensor:
    """Paired Contrast Mean Shift: v = (1/n) sum_i [h(x_i+) - h(x_i-)] over topic-matched pairs."""
    require(undesired.shape == neutral.shape and undesired.shape[0] > 0,
            f"PCMS needs the same positive number of undesired and neutral examples, paired row by row; "
            f"got {tuple(undesired.shape)} and {tuple(neutral.shape)}")
    return (undesired - neutral).mean(0)


def ums_direction(undesired: torch.Tensor, neutral: torch.Tensor) -> torch.Tensor:
    """Unpaired Mean Shift: v = mean over D+ of h - mean over D- of h (the sets may differ in size and topic)."""
    require(undesired.shape[0] > 0 and neutral.shape[0] > 0, "UMS needs at least one undesired and one neutral example")
    return undesired.mean(0) - neutral.mean(0)


def ilcs_direction(undesired: torch.Tensor, neutral: torch.Tensor, index: int = 0) -> torch.Tensor:
    """Instance-Level Contrast Shift: v = h(x+) - h(x-) from the single contrast pair number `index`."""
    n = min(undesired.shape[0], neutral.shape[0])
    require(0 <= index < n, f"ILCS pair index {index} is out of range for {n} pair(s)")
    return undesired[index] - neutral[index]


def estimate(method: str, undesired: torch.Tensor, neutral: torch.Tensor, pair_index: int = 0) -> torch.Tensor:
    require(method in METHODS, f"unknown steering method '{method}'", f"use one of {', '.join(METHODS)}")
    if method == "pcms":
        return pcms_direction(undesired, neutral)
    if method == "ums":
        return ums_direction(undesired, neutral)
    return ilcs_direction(undesired, neutral, pair_index)


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(a.double(), b.double(), dim=0))


def split_half_cosine(method: str, undesired: torch.Tensor, neutral: torch.Tensor, repeats: int = 20,
                      seed: int = 0) -> float:
    """Mean cos(v_A, v_B) between directions estimated on two disjoint random halves of the examples.

    Each estimator is resampled the way it consumes data: PCMS splits the pairs; UMS ignores pairing, so the
    undesired and the neutral sets are halved by independent permutations (as two unpaired samples would be);
    ILCS compares one random pair from each half.
    """
    n_u, n_n = undesired.shape[0], neutral.shape[0]
    require(min(n_u, n_n) >= 2, "split-half stability needs at least 2 examples on each side")
    generator = torch.Generator().manual_seed(seed)
    total = 0.0
    for _ in range(repeats):
        if method == "ums":
            perm_u, perm_n = torch.randperm(n_u, generator=generator), torch.randperm(n_n, generator=generator)
            a = ums_direction(undesired[perm_u[: n_u // 2]], neutral[perm_n[: n_n // 2]])
            b = ums_direction(undesired[perm_u[n_u // 2:]], neutral[perm_n[n_n // 2:]])
        else:
            require(n_u == n_n, f"{method.upper()} needs paired examples ({n_u} undesired vs {n_n} neutral)")
            perm = torch.randperm(n_u, generator=generator)
            half_a, half_b = perm[: n_u // 2], perm[n_u // 2:]
            if method == "pcms":
                a = pcms_direction(undesired[half_a], neutral[half_a])
                b = pcms_direction(undesired[half_b], neutral[half_b])
            else:
                a = ilcs_direction(undesired[half_a], neutral[half_a], 0)
                b = ilcs_direction(undesired[half_b], neutral[half_b], 0)
        total += cosine(a, b)
    return total / repeats
