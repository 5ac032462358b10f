"""Pruning masks: Wanda and magnitude scores, per-row unstructured and N:M selection. True = weight kept."""

from __future__ import annotations

import torch

from toolkit.core.errors import BadInputError


def parse_nm(spec: str | None) -> tuple[int, int] | None:
    """'2:4' -> (2, 4): N weights pruned in every group of M consecutive input columns (the Wanda/OBR convention)."""
    if spec in (None, "", "none"):
        return None
    try:
        n, m = (int(part) for part in str(spec).split(":"))
    except ValueError:
        raise BadInputError(f"--nm must look like N:M (e.g. 2:4), got '{spec}'") from None
    if not 0 < n < m:
        raise BadInputError(f"--nm {spec}: need 0 < N < M")
    return n, m


def wanda_scores(W: torch.Tensor, input_sq_mean: torch.Tensor) -> torch.Tensor:
    """|W_ij|·‖x_j‖ with ‖x_j‖² the mean of x_j² over all calibration tokens (an exact mean, not a running bias)."""
    return W.abs() * input_sq_mean.clamp(min=0).sqrt().reshape(1, -1).to(W.dtype)


def magnitude_scores(W: torch.Tensor) -> torch.Tensor:
    return W.abs()


def unstructured_mask(scores: torch.Tensor, sparsity: float) -> torch.Tensor:
    """Per output row, drop the ⌊sparsity·C_in⌋ lowest scores."""
    check_sparsity(sparsity)
    drop = int(sparsity * scores.shape[1])
    mask = torch.ones_like(scores, dtype=torch.bool)
    if drop:
        idx = torch.topk(scores, drop, dim=1, largest=False).indices
        mask.scatter_(1, idx, False)
    return mask


def nm_mask(scores: torch.Tensor, n: int, m: int) -> torch.Tensor:
    """Drop the n lowest scores in each group of m consecutive columns."""
    rows, cols = scores.shape
    if cols % m:
        raise BadInputError(f"N:M sparsity needs the input size ({cols}) to be a multiple of M={m}")
    groups = scores.reshape(rows, cols // m, m)
    idx = torch.topk(groups, n, dim=2, largest=False).indices
    mask = torch.ones_like(groups, dtype=torch.bool).scatter_(2, idx, False)
    return mask.reshape(rows, cols)


def make_mask(scores: torch.Tensor, sparsity: float, nm: tuple[int, int] | None) -> torch.Tensor:
    if nm is not None:
        return nm_mask(scores, *nm)
    return unstructured_mask(scores, sparsity)


def sparsity_problem(value: float) -> str | None:
    """The one sparsity rule (the config's validator and check_sparsity both apply it)."""
    return None if 0.0 <= value < 1.0 else f"sparsity must be in [0, 1), got {value}"


def check_sparsity(sparsity: float) -> None:
    """sparsity_problem's rule, as bad input (for the solvers' direct callers)."""
    problem = sparsity_problem(sparsity)
    if problem:
        raise BadInputError(problem)
