"""The exact batched Cholesky of row-restricted systems: per row, M_SS with S the row's own column set, gathered,
padded with an identity to the widest row, and factored in one batch (OBR's exact restoration, the block-Jacobi
preconditioner of toolkit.linalg.restricted)."""

from __future__ import annotations

import torch

from toolkit.core.errors import RunError


def padded_indices(select: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row, the selected column indices first (ascending), padded to the row maximum; plus a validity mask."""
    counts = select.sum(dim=1)
    width = int(counts.max().item()) if select.numel() else 0
    order = torch.argsort((~select).to(torch.int8), dim=1, stable=True)[:, :width]
    valid = torch.arange(width, device=select.device).unsqueeze(0) < counts.unsqueeze(1)
    return order, valid


def cholesky_blocks(M: torch.Tensor, idx: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Per row, the Cholesky factor of M_SS (S its valid indices), padded with an identity: [rows, w, w]."""
    okf = valid.to(M.dtype)
    system = M[idx.unsqueeze(2), idx.unsqueeze(1)] * okf.unsqueeze(2) * okf.unsqueeze(1)
    system.diagonal(dim1=1, dim2=2).add_(1.0 - okf)
    L, info = torch.linalg.cholesky_ex(system)
    if (info != 0).any():
        raise RunError("a restricted Hessian block is not positive definite", "raise percdamp")
    return L


def triangular_solves(L: torch.Tensor, rhs: torch.Tensor) -> torch.Tensor:
    # two triangular solves: several times faster than cholesky_solve for batched single right-hand sides
    y = torch.linalg.solve_triangular(L, rhs.unsqueeze(2), upper=False)
    return torch.linalg.solve_triangular(L.transpose(1, 2), y, upper=True).squeeze(2)


def factor_rows(M: torch.Tensor, rhs_full: torch.Tensor, idx: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """For each row, y = M_SS⁻¹ rhs_S with S its valid indices (padded entries give 0): one batched Cholesky."""
    okf = valid.to(M.dtype)
    return triangular_solves(cholesky_blocks(M, idx, valid), torch.gather(rhs_full, 1, idx) * okf) * okf
