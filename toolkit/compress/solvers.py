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
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from toolkit.compress.masks import check_sparsity
from toolkit.compress.quant import quantize_rows
from toolkit.core.errors import RunError
from toolkit.linalg.hessian import damped_cholesky
from toolkit.linalg.padded import factor_rows, padded_indices
from toolkit.linalg.restricted import Deflation, SolveStats, auto_rank, deflation_basis, masked_pcg


@dataclass
class DampedHessian:
    """H with dead inputs given a unit diagonal and λI added (λ escalated until Cholesky succeeds)."""

    H: torch.Tensor
    L: torch.Tensor
    damp: float
    dead: torch.Tensor
    cache: dict = field(default_factory=dict, repr=False, compare=False)

    def inverse(self) -> torch.Tensor:
        """H⁻¹ (from the Cholesky factor; computed once and shared by GPTQ and the restoration solves)."""
        if "inverse" not in self.cache:
            self.cache["inverse"] = torch.cholesky_inverse(self.L)
        return self.cache["inverse"]

    def inverse_upper(self) -> torch.Tensor:
        """Upper Cholesky factor U of H⁻¹ (H⁻¹ = UᵀU): row i of U gives GPTQ's update once columns < i are fixed."""
        return torch.linalg.cholesky(self.inverse(), upper=True)

    def deflation(self, rank: int = 64) -> Deflation:
        """The low-rank + shift model of the Jacobi-scaled H the restoration's CG preconditions with (computed
        once per rank; a solve truncates it to its own rank)."""
        key = ("deflation", rank)
        if key not in self.cache:
            self.cache[key] = deflation_basis(self.H, rank)
        return self.cache[key]

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


def _workers() -> int:
    return max(1, min(8, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))


# restricted_solve's methods: "cg" (deflation-preconditioned, the default of `compress obr`), "cholesky" (exact), and
# CG with the other preconditioners (compared in examples/scale/RESULTS.md)
PRECONDITIONERS = {"cg": "deflation", "cg-jacobi": "jacobi", "cg-inverse": "inverse", "cg-block": "block-jacobi"}
SOLVERS = ("cholesky", *PRECONDITIONERS)


def restricted_solve(H: torch.Tensor, A: torch.Tensor, B: torch.Tensor, V: torch.Tensor,
                     max_bytes: int = 64 * 2**20, method: str = "cholesky", tol: float | None = None, *,
                     deflation: Deflation | None = None, inverse: torch.Tensor | None = None,
                     stop: str | None = None, rank: int | None = None, block: int = 64, window: int = 3,
                     segments: list[int] | None = None,
                     low_precision_setup: bool = False, obs: bool | None = None, cg_bytes: int = 256 * 2**20,
                     product: str = "full", refresh: int = 0,
                     stats: SolveStats | None = None) -> torch.Tensor:
    """Row by row, x_A = H_AA⁻¹ · H_AB · v_B for the row's own column sets A and B (boolean masks, rows × C);
    returns x scattered into a rows × C tensor (zero outside A). Only the columns some row selects take part:
    H is cut to A's columns for the system and B's for the right-hand side (OBR's quantization solve lives in the
    columns ≥ ⌊α·C⌋).

    method: "cholesky" (exact: one batched Cholesky per chunk of rows; with complementary sets and |B| < |A| the
    OBS identity x_A = −G_AB G_BB⁻¹ v_B factors the smaller side; `obs` True/False forces it on/off),
    "cg" (deflation-preconditioned conjugate gradients stopped when the layer loss is within `tol` (default 1e-3,
    relative) of its optimum: toolkit.linalg.restricted), "cg-jacobi" / "cg-inverse" / "cg-block" (the same CG
    with the Jacobi preconditioner, the restriction of H⁻¹, or exact diagonal blocks of `block` columns). `stop="residual"` stops CG at ‖r‖ ≤ tol·‖rhs‖ instead (tol default 1e-4 in float32,
    1e-10 in float64: the criterion before issue 42). `stats` (a SolveStats) records what the solve did."""
    rows, columns = A.shape
    out = torch.zeros(rows, columns, dtype=H.dtype, device=H.device)
    if not A.any() or not B.any():
        return out
    VB = V.to(H.dtype) * B
    cols_a = A.any(dim=0).nonzero().squeeze(1)
    cols_b = B.any(dim=0).nonzero().squeeze(1)
    if method == "cholesky":
        smaller = int(B.sum(1).max()) < int(A.sum(1).max())
        if obs is not False and torch.equal(B, ~A) and (obs or smaller):
            return _obs_identity_solve(H, A, B, VB, max_bytes, inverse, stats)
        rhs_full = VB @ H  # row c: Σ_{b∈B_c} v_cb H[b, :]  (H symmetric)
        return _cholesky_rows(H, A, rhs_full, out, max_bytes, stats)
    if method not in SOLVERS:
        raise ValueError(f"unknown restricted solver {method!r} (one of {', '.join(SOLVERS)})")
    return _cg_rows(H, A, VB, out, cols_a, cols_b, PRECONDITIONERS[method], tol, stop=stop, deflation=deflation,
                    inverse=inverse, rank=rank, segments=segments, cg_bytes=cg_bytes, stats=stats,
                    options=dict(block=block, window=window, low_precision_setup=low_precision_setup,
                                 product=product, refresh=refresh))


def _cg_rows(H, A, VB, out, cols_a, cols_b, preconditioner: str, tol, *, stop, deflation, inverse, rank, segments,
             cg_bytes, stats, options: dict) -> torch.Tensor:
    """restricted_solve's conjugate-gradient methods: H cut to the columns some row uses, the preconditioner set
    up once, rows in cache-sized chunks."""
    rows, columns = A.shape
    full_a, full_b = len(cols_a) == columns, len(cols_b) == columns
    # one product gives both the right-hand side (on A's columns) and each row's loss before the correction
    part = VB[:, cols_b] @ (H[cols_b] if not full_b else H)  # [rows, C]
    loss0 = (part[:, cols_b] * VB[:, cols_b]).sum(dim=1)
    Ha = H if full_a else H[cols_a][:, cols_a]
    rhs = part if full_a else part[:, cols_a]
    Aa = A if full_a else A[:, cols_a]
    stop = stop or "loss"
    if tol is None:
        tol = 1e-3 if stop == "loss" else (1e-10 if H.dtype == torch.float64 else 1e-4)
    model = None
    if preconditioner == "deflation":
        rank = rank if rank is not None else auto_rank(len(cols_a))
        model = (deflation if deflation is not None else deflation_basis(H, rank)).truncated(rank).restricted(
            None if full_a else cols_a)
    G = None
    if preconditioner == "inverse":
        G = inverse if inverse is not None else torch.cholesky_inverse(torch.linalg.cholesky(H))
        G = G if full_a else G[cols_a][:, cols_a]
    options = dict(options, tol=tol, stop=stop, preconditioner=preconditioner, deflation=model, rank=rank, inverse=G,
                   stats=stats)
    # rows in chunks whose CG work arrays (~12 of rows × |A's columns|) fit `cg_bytes`: each chunk meets the
    # tolerance on its own loss (so the layer does), and its vectors stay in cache between the products
    chunk = rows if segments else max(256, cg_bytes // (12 * Ha.shape[0] * Ha.element_size()))
    for r0 in range(0, rows, chunk):
        r1 = min(r0 + chunk, rows)
        x = masked_pcg(Ha, Aa[r0:r1], rhs[r0:r1], loss0=loss0[r0:r1], segments=segments, **options)
        if full_a:
            out[r0:r1] = x
        else:
            out[r0:r1, cols_a] = x
    return out


def _cholesky_rows(H, A, rhs_full, out, max_bytes, stats):
    """Exact: each row's H_AA gathered, padded with an identity to the chunk's largest |A|, factored by one batched
    Cholesky; chunks of rows run on a thread each (torch's batched Cholesky factors one matrix after another and
    its kernels drop the GIL)."""
    started = time.process_time()
    rows = A.shape[0]
    idx, valid = padded_indices(A)
    width = idx.shape[1]
    chunk = max(1, max_bytes // max(1, width * width * H.element_size()))
    starts = range(0, rows, chunk)

    def solve(r0):
        r1 = min(r0 + chunk, rows)
        return r0, factor_rows(H, rhs_full[r0:r1], idx[r0:r1], valid[r0:r1]), idx[r0:r1]

    with ThreadPoolExecutor(max_workers=min(_workers(), len(starts))) as pool:
        for r0, x, ids in pool.map(solve, starts):
            out[r0:r0 + x.shape[0]].scatter_(1, ids, x)
    if stats is not None:
        stats.method, stats.rows, stats.columns = "cholesky", rows, A.shape[1]
        stats.seconds += time.process_time() - started
        stats.extra["factor_size"] = width
    return out


def _obs_identity_solve(H, A, B, VB, max_bytes, inverse, stats):
    """x_A = −G_AB (G_BB)⁻¹ v_B (G = H⁻¹, B = not A): the OBS form of the same minimiser, factoring |B| × |B|."""
    started = time.process_time()
    G = inverse if inverse is not None else torch.cholesky_inverse(torch.linalg.cholesky(H))
    multipliers = torch.zeros_like(VB)
    _cholesky_rows(G, B, VB, multipliers, max_bytes, None)
    out = -(multipliers @ G) * A
    if stats is not None:
        stats.method, stats.rows, stats.columns = "cholesky-obs", A.shape[0], A.shape[1]
        stats.seconds += time.process_time() - started
        stats.extra["factor_size"] = int(B.sum(1).max())
    return out

