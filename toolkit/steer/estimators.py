"""The three direction estimators (pure math on activation matrices) and their split-half stability.

Reconstruction of "Inference-Time Personalized Safety Control via Paired Difference-in-Means Intervention"
(OpenReview VHiHVBNy1M; no official code). Rows of `undesired` / `neutral` are residual-stream activations
h_l(x) of shape (n, d); for the paired estimators row i of both matrices comes from the same topic.
"""

from __future__ import annotations

from typing import Protocol

import torch

from toolkit.core.errors import require


class Estimator(Protocol):
    """A registered direction estimator (toolkit/steer/methods/): a direction (d,) from the undesired and neutral
    activations (n, d); `pair_index` is the one pair an instance-level estimator uses."""

    def __call__(self, undesired: torch.Tensor, neutral: torch.Tensor, pair_index: int = 0) -> torch.Tensor: ...


def estimator(method: str):
    """The registry entry of estimator `method` (unknown: one BadInputError line listing the known ones)."""
    from toolkit.core.registry import registry  # toolkit/steer/__init__.py declares the estimators' modules

    return registry("steer").get(method)


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
    """The direction of the registered estimator `method`."""
    return estimator(method).obj(undesired, neutral, pair_index)


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(a.double(), b.double(), dim=0))


def split_half_cosine(method: str, undesired: torch.Tensor, neutral: torch.Tensor, repeats: int = 20,
                      seed: int = 0) -> float:
    """Mean cos(v_A, v_B) between directions estimated on two disjoint random halves of the examples.

    Each estimator is resampled the way it consumes data: a paired one (PCMS, ILCS) splits the pairs (ILCS then
    compares one random pair from each half: pair 0 of each shuffled half); an unpaired one (UMS) ignores pairing,
    so the undesired and the neutral sets are halved by independent permutations (as two unpaired samples would
    be).
    """
    n_u, n_n = undesired.shape[0], neutral.shape[0]
    require(min(n_u, n_n) >= 2, "split-half stability needs at least 2 examples on each side")
    entry = estimator(method)
    generator = torch.Generator().manual_seed(seed)
    total = 0.0
    for _ in range(repeats):
        if not entry.meta.get("paired", True):
            perm_u, perm_n = torch.randperm(n_u, generator=generator), torch.randperm(n_n, generator=generator)
            a = entry.obj(undesired[perm_u[: n_u // 2]], neutral[perm_n[: n_n // 2]], 0)
            b = entry.obj(undesired[perm_u[n_u // 2:]], neutral[perm_n[n_n // 2:]], 0)
        else:
            require(n_u == n_n, f"{method.upper()} needs paired examples ({n_u} undesired vs {n_n} neutral)")
            perm = torch.randperm(n_u, generator=generator)
            half_a, half_b = perm[: n_u // 2], perm[n_u // 2:]
            a = entry.obj(undesired[half_a], neutral[half_a], 0)
            b = entry.obj(undesired[half_b], neutral[half_b], 0)
        total += cosine(a, b)
    return total / repeats
