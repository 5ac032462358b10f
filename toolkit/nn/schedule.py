"""Learning-rate schedule factors, one implementation for every training loop in the house.

Each loop composes these (multiplying a peak LR) the way its paper's official code does: e.g. remove-ln's
cosine_with_min_lr is `linear_warmup` then `cosine(progress, floor)`; the zoo's recipe multiplies a warm-up ramp by a
cosine over all steps; the backdoor defense's classifier decays linearly."""

from __future__ import annotations

import math


def cosine(progress: float, floor: float = 0.0) -> float:
    """floor + (1 - floor)·½(1 + cos(π·p)), p clamped to [0, 1]: 1 at the start, `floor` at the end."""
    p = min(1.0, max(0.0, progress))
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * p))


def cosine_steps(step: int, total: int, floor: float = 0.0) -> float:
    """`cosine` at step/total, with the angle computed as π·step/total (the order the step-indexed loops use, so
    their learning rates stay bit-identical)."""
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * step / total))


def linear_warmup(step: int, warmup: int) -> float:
    """(step + 1) / warmup for the first `warmup` steps, then 1 (no warm-up when warmup <= 0)."""
    return 1.0 if warmup <= 0 else min(1.0, (step + 1) / warmup)


def warmup_cosine(step: int, total: int, warmup: int, floor: float = 0.0, peak: float = 1.0) -> float:
    """Linear warm-up for `warmup` steps, then cosine from 1 to `floor` over the remaining steps; times `peak`.

    With `peak` the result is the learning rate itself (the weight VAE sets it on the optimiser each step): the ramp
    is computed as peak·(step + 1)/warmup, the order that loop always used, so its rates stay bit-identical; with
    peak = 1 it is the factor a LambdaLR multiplies, unchanged."""
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * cosine((step - warmup) / max(1, total - warmup), floor)


def linear_decay(step: int, total: int) -> float:
    """1 − step/total, floored at 0: HF's linear schedule without warm-up (total <= 0 counts as 1)."""
    return max(0.0, 1 - step / max(total, 1))
