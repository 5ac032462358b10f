"""Second-order solvers on a layer Hessian H = 2/n Σ x xᵀ: damping, GPTQ (with a start column, a fixed mask and
activation ordering), SparseGPT's joint prune + quantize, and batched restricted solves H_AA⁻¹ H_AB v for many rows
at once.

Activation ordering (GPTQ's "act-order", llm-compressor's `actorder`): columns are processed in decreasing order of
diag(H) (the inputs with the largest mean square first), so the columns whose error costs most are quantized while
the most later columns are still free to absorb it; the result is permuted back exactly. The grid is not part of
the ordering: the caller fits it (quant.fit_grid) on the weights before GPTQ, and passes per-entry scales for grouped
grids, which travel with their columns."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

from toolkit.compress.masks import check_sparsity
from toolkit.compress.quant import quantize_rows
from toolkit.core.errors import RunError
from toolkit.linalg.hessian import damped_cholesky


@dataclass
class DampedHessian:
    """H with dead inputs given a unit diagonal and λI added (λ escalated until Cholesky succeeds)."""

    H: torch.Tensor
    L: torch.Tensor
    damp: float
    dead: torch.Tensor

    def inverse_upper(self) -> torch.Tensor:
        """Upper Cholesky factor U of H⁻¹ (H⁻¹ = UᵀU): row i of U gives GPTQ's update once columns < i are fixed."""
        return torch.linalg.cholesky(torch.cholesky_inverse(self.L), upper=True)

    def permuted(self, order: torch.Tensor) -> DampedHessian:
        """The same damped H with rows and columns in `order` (its Cholesky factor recomputed)."""
        H = self.H[order][:, order]
        L, info = torch.linalg.cholesky_ex(H)
        if info.item() != 0:
            raise RunError("the permuted damped Hessian is not positive definite", "raise percdamp")
        return DampedHessian(H=H, L=L, damp=self.damp, dead=self.dead[order])


def activation_order(H: torch.Tensor) -> torch.Tensor:
    """The column permutation of activation ordering: decreasing diag(H) (stable, so ties keep their order)."""
    return torch.argsort(torch.diag(H), descending=True, stable=True)


def damp_hessian(H: torch.Tensor, percdamp: float = 0.01) -> DampedHessian:
    H = H.clone()
    dead = torch.diag(H) == 0
    H[dead, dead] = 1.0
    L, damp = damped_cholesky(H, percdamp)
    H.diagonal().add_(damp)
    return DampedHessian(H=H, L=L, damp=damp, dead=dead)


def _quantize_column(w: torch.Tensor, scale: torch.Tensor | None, bits: int) -> torch.Tensor:
    if scale is None or bits >= 16:
        return w
    return quantize_rows(w.unsqueeze(1), scale, bits).squeeze(1)


def _column_scale(scale: torch.Tensor | None, column: int) -> torch.Tensor | None:
    """A per-row scale [rows] serves every column; a per-entry scale [rows, columns] gives column `column`'s."""
    return scale if scale is None or scale.dim() == 1 else scale[:, column]


def gptq(W: torch.Tensor, hessian: DampedHessian, scale: torch.Tensor | None, bits: int, *, start: int = 0,
         mask: torch.Tensor | None = None, blocksize: int = 128, order: torch.Tensor | None = None) -> torch.Tensor:
    """GPTQ over columns start..C−1 (columns before `start` are returned unchanged and their errors are not
    propagated). Each quantized column is multiplied by its mask column; the error, pruned weights included, is
    spread over the later columns with the rows of U = chol(H⁻¹)ᵀ. Starts exactly at `start`, any value.
    `scale` is per row [rows] or per entry [rows, C] (grouped grids). With `order` (a permutation of the columns,
    e.g. `activation_order(H)`) the columns are processed in that order and the result is permuted back."""
    if order is not None:
        if start:
            raise ValueError("activation ordering needs start = 0")
        inverse = torch.argsort(order)
        permuted_scale = scale[:, order] if scale is not None and scale.dim() == 2 else scale
        Q = gptq(W[:, order], hessian.permuted(order), permuted_scale, bits,
                 mask=None if mask is None else mask[:, order], blocksize=blocksize)
        return Q[:, inverse]
    W = W.to(hessian.H.dtype).clone()
    W[:, hessian.dead] = 0
    U = hessian.inverse_upper()
    Q = W.clone()
    columns = W.shape[1]
    for b0 in range(start, columns, blocksize):
        b1 = min(b0 + blocksize, columns)
        block, U1 = W[:, b0:b1].clone(), U[b0:b1, b0:b1]
        errors = torch.zeros_like(block)
        for i in range(b1 - b0):
            w = block[:, i]
            q = _quantize_column(w, _column_scale(scale, b0 + i), bits)
            if mask is not None:
                q = q * mask[:, b0 + i]
            Q[:, b0 + i] = q
            err = (w - q) / U1[i, i]
            block[:, i:] -= err.unsqueeze(1) * U1[i, i:].unsqueeze(0)
            errors[:, i] = err
        W[:, b1:] -= errors @ U[b0:b1, b1:]
    return Q


def sparsegpt(W: torch.Tensor, hessian: DampedHessian, scale: torch.Tensor | None, bits: int, sparsity: float,
              nm: tuple[int, int] | None = None, blocksize: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """SparseGPT with joint GPTQ quantization: per block of columns pick the mask by w²/[H⁻¹]_jj² (unstructured:
    the lowest `sparsity` share of the block; N:M: the N lowest of each M columns), quantize, propagate errors.
    Returns (Ŵ, kept mask)."""
    check_sparsity(sparsity)
    W = W.to(hessian.H.dtype).clone()
    W[:, hessian.dead] = 0
    U = hessian.inverse_upper()
    Q = torch.zeros_like(W)
    keep = torch.ones_like(W, dtype=torch.bool)
    columns = W.shape[1]
    for b0 in range(0, columns, blocksize):
        b1 = min(b0 + blocksize, columns)
        block, U1 = W[:, b0:b1].clone(), U[b0:b1, b0:b1]
        errors = torch.zeros_like(block)
        diag = torch.diag(U1)
        if nm is None and sparsity > 0:
            score = block.pow(2) / diag.pow(2).unsqueeze(0)
            drop = int(score.numel() * sparsity)
            if drop:
                threshold = torch.sort(score.flatten())[0][drop - 1]
                keep[:, b0:b1] = score > threshold
        for i in range(b1 - b0):
            column = b0 + i
            if nm is not None and i % nm[1] == 0:
                score = block[:, i:i + nm[1]].pow(2) / diag[i:i + nm[1]].pow(2).unsqueeze(0)
                idx = torch.topk(score, nm[0], dim=1, largest=False).indices
                keep[:, column:column + nm[1]].scatter_(1, idx, False)
            w = block[:, i]
            q = _quantize_column(w * keep[:, column], _column_scale(scale, column), bits)
            Q[:, column] = q
            err = (w - q) / U1[i, i]
            block[:, i:] -= err.unsqueeze(1) * U1[i, i:].unsqueeze(0)
            errors[:, i] = err
        W[:, b1:] -= errors @ U[b0:b1, b1:]
    return Q, keep


def sparsegpt_then_gptq(W: torch.Tensor, hessian: DampedHessian, bits: int, sparsity: float,
                        nm: tuple[int, int] | None, refit, blocksize: int = 128,
                        order: torch.Tensor | None = None):
    """The two-stage baseline (llm-compressor's SparseGPTModifier → GPTQModifier, on one calibration pass): prune with
    SparseGPT (OBS updates of the kept weights, no quantization), refit the quantizer on the sparse weights
    (`refit(pruned) -> WeightGrid`), then GPTQ on the same H keeping the mask (pruned entries stay exactly 0).
    Returns (Ŵ, kept mask, grid)."""
    pruned, keep = sparsegpt(W, hessian, None, 16, sparsity, nm, blocksize)
    grid = refit(pruned)
    if bits >= 16:
        return pruned, keep, grid
    out = gptq(pruned, hessian, grid.per_column(W.shape[1]), bits, mask=keep, blocksize=blocksize, order=order)
    return out, keep, grid


def _padded_indices(select: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row, the selected column indices first (ascending), padded to the row maximum; plus a validity mask."""
    counts = select.sum(dim=1)
    width = int(counts.max().item()) if select.numel() else 0
    order = torch.argsort((~select).to(torch.int8), dim=1, stable=True)[:, :width]
    valid = torch.arange(width, device=select.device).unsqueeze(0) < counts.unsqueeze(1)
    return order, valid


def _workers() -> int:
    return max(1, min(8, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))


def _solve_rows(H, rhs_full, idx, valid, r0: int, r1: int):
    ids, ok = idx[r0:r1], valid[r0:r1]
    okf = ok.to(H.dtype)
    system = H[ids.unsqueeze(2), ids.unsqueeze(1)] * okf.unsqueeze(2) * okf.unsqueeze(1)
    system.diagonal(dim1=1, dim2=2).add_(1.0 - okf)
    rhs = torch.gather(rhs_full[r0:r1], 1, ids) * okf
    L, info = torch.linalg.cholesky_ex(system)
    if (info != 0).any():
        raise RunError("a restricted Hessian block H_RR is not positive definite", "raise percdamp")
    # two triangular solves: several times faster than cholesky_solve for batched single right-hand sides
    y = torch.linalg.solve_triangular(L, rhs.unsqueeze(2), upper=False)
    x = torch.linalg.solve_triangular(L.transpose(1, 2), y, upper=True).squeeze(2) * okf
    return r0, x, ids


def restricted_solve(H: torch.Tensor, A: torch.Tensor, B: torch.Tensor, V: torch.Tensor,
                     max_bytes: int = 64 * 2**20, method: str = "cholesky", tol: float | None = None) -> torch.Tensor:
    """Row by row, x_A = H_AA⁻¹ · H_AB · v_B for the row's own column sets A and B (boolean masks, rows × C);
    returns x scattered into a rows × C tensor (zero outside A). Rows are solved in batches: each row's H_AA is
    gathered, padded with an identity to the batch's largest |A|, and factored by one batched Cholesky."""
    rows, columns = A.shape
    out = torch.zeros(rows, columns, dtype=H.dtype, device=H.device)
    if not A.any() or not B.any():
        return out
    rhs_full = (V.to(H.dtype) * B) @ H  # row c: Σ_{b∈B_c} v_cb H[b, :]  (H symmetric)
    if method == "cg":
        return masked_conjugate_gradient(H, A, rhs_full * A, tol)
    idx, valid = _padded_indices(A)
    width = idx.shape[1]
    chunk = max(1, max_bytes // max(1, width * width * H.element_size()))
    starts = range(0, rows, chunk)
    # torch's batched Cholesky factors one matrix after another: chunks run on a thread each (kernels drop the GIL)
    with ThreadPoolExecutor(max_workers=min(_workers(), len(starts))) as pool:
        for r0, x, ids in pool.map(lambda r0: _solve_rows(H, rhs_full, idx, valid, r0, min(r0 + chunk, rows)), starts):
            out[r0:r0 + x.shape[0]].scatter_(1, ids, x)
    return out


def masked_conjugate_gradient(H: torch.Tensor, A: torch.Tensor, rhs: torch.Tensor, tol: float | None = None,
                              max_iter: int | None = None) -> torch.Tensor:
    """All rows at once, x_A = H_AA⁻¹ rhs_A by Jacobi-preconditioned conjugate gradients: one (rows × C) @ (C × C)
    GEMM per iteration instead of a Cholesky of every row's H_AA, which is what makes OBR's cost close to GPTQ's on
    wide layers. Rows stop once ‖r‖ ≤ tol·‖rhs‖ (default 1e-4 in float32, 1e-10 in float64); exact arithmetic would
    finish in |A| steps, so max_iter defaults to C."""
    tol = tol if tol is not None else (1e-10 if H.dtype == torch.float64 else 1e-4)
    mask = A.to(H.dtype)
    inverse_diagonal = mask / torch.diag(H).unsqueeze(0)
    x = torch.zeros_like(rhs)
    residual = rhs.clone()
    z = residual * inverse_diagonal
    direction = z.clone()
    rz = (residual * z).sum(dim=1, keepdim=True)
    target = (tol * rhs.norm(dim=1, keepdim=True)).square()
    active = residual.square().sum(dim=1, keepdim=True) > target
    for _ in range(max_iter or H.shape[0]):
        if not active.any():
            break
        Hd = (direction @ H) * mask
        curvature = (direction * Hd).sum(dim=1, keepdim=True)
        step = torch.where(active, rz / torch.where(active, curvature, 1.0), 0.0)
        x += step * direction
        residual -= step * Hd
        z = residual * inverse_diagonal
        rz_next = (residual * z).sum(dim=1, keepdim=True)
        direction = z + torch.where(active, rz_next / torch.where(active, rz, 1.0), 0.0) * direction
        rz = rz_next
        active = active & (residual.square().sum(dim=1, keepdim=True) > target)
    return x
