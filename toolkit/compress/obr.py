"""OBR: Optimal Brain Restoration for joint quantization and sparsification of LLMs.

Paper: Hang Guo, Yawei Li, Luca Benini, "Optimal Brain Restoration for Joint Quantization and Sparsification of
LLMs", arXiv 2509.11177 (https://arxiv.org/abs/2509.11177). Official code: https://github.com/csguoh/OBR (read to
learn, not copied).

Per output row c with kept columns R and pruned columns E (the Wanda mask), on the layer Hessian H:
  1. pruning compensation  δ_R = H_RR⁻¹ H_RE w_E         (minimises δᵀHδ s.t. δ_E = −w_E; the code's + sign)
  2. quantization compensation: e = w̄ − Q(w̄) on E2 = R ∩ [0, ⌊α·C_in⌋), then δ_R2 += H_R2R2⁻¹ H_R2E2 e_E2
  3. OBR_RTN: Ŵ = Q(W_pre);  OBR_GPTQ: RTN on columns < ⌊α·C_in⌋, GPTQ from exactly ⌊α·C_in⌋ on.
All rows are solved at once, not one Python loop per row: by conjugate gradients preconditioned with a deflation
model of H and stopped when the layer loss is within a relative tolerance of its optimum (default; issue 42,
examples/scale/SOLVERS.md), or exactly by a batched Cholesky over padded H_RR blocks. Fixed versus
the official code: α is honoured everywhere (no hard-coded 0.5), GPTQ starts exactly at ⌊α·C_in⌋ (no skipped
128-column blocks left at zero), and the Wanda statistic is an exact mean.
"""

from __future__ import annotations

import torch

from toolkit.compress.config import ObrConfig  # noqa: F401 - declared in config.py
from toolkit.compress.quant import quantize_rows
from toolkit.compress.solvers import DampedHessian, gptq, restricted_solve
from toolkit.linalg.restricted import SolveStats


def group_split(columns: int, alpha: float) -> int:
    """t = ⌊α·C_in⌋: columns < t form E2 (closed-form compensated, then RTN), columns ≥ t form R2."""
    return int(alpha * columns)


def obr_restore(W: torch.Tensor, H: torch.Tensor | DampedHessian, keep: torch.Tensor, scale: torch.Tensor | None,
                bits: int, alpha: float, solver: str = "cholesky", *, tol: float | None = None,
                rank: int | None = None, options: dict | None = None, stats: list | None = None) -> torch.Tensor:
    """W_pre = W ⊙ M + Δ: pruning compensation on R, then quantization-error compensation from E2 to R2.
    H must already be damped (a DampedHessian shares its H⁻¹ and deflation model with the solves); `scale` is the
    quantizer scale fitted on the dense W, per row [rows] or per entry [rows, C] for grouped grids (our extension:
    the official OBR is per channel); None: no quantization. `solver`/`tol`/`rank` (+ `options`, more keywords):
    solvers.restricted_solve; `stats`: a list that receives one SolveStats per solve."""
    hessian = H if isinstance(H, DampedHessian) else None
    H = hessian.H if hessian is not None else H
    W = W.to(H.dtype)
    options = {"method": solver, "tol": tol, "rank": rank, **(options or {})}
    if hessian is not None and solver == "cg":
        options["deflation"] = hessian.deflation(max(rank or 0, 64))
    if hessian is not None and solver in ("cholesky", "cg-inverse"):
        options["inverse"] = hessian.inverse()

    def solve(A, B, V):
        record = SolveStats() if stats is not None else None
        x = restricted_solve(H, A, B, V, stats=record, **options)
        if stats is not None:
            stats.append(record)
        return x

    restored = (W + solve(keep, ~keep, W)) * keep
    if scale is None or bits >= 16:
        return restored
    t = group_split(W.shape[1], alpha)
    if t == 0:
        return restored
    error = restored - quantize_rows(restored, scale, bits)
    first = torch.zeros_like(keep)
    first[:, :t] = True
    return restored + solve(keep & ~first, keep & first, error)


def obr_quantize(W: torch.Tensor, hessian: DampedHessian, keep: torch.Tensor, scale: torch.Tensor | None,
                 bits: int, alpha: float, mode: str, blocksize: int = 128, solver: str = "cholesky", *,
                 tol: float | None = None, rank: int | None = None, options: dict | None = None,
                 stats: list | None = None) -> torch.Tensor:
    """The full OBR layer update: restore, then OBR_RTN or OBR_GPTQ."""
    W = W.to(hessian.H.dtype).clone()
    W[:, hessian.dead] = 0
    restored = obr_restore(W, hessian, keep, scale, bits, alpha, solver, tol=tol, rank=rank, options=options,
                           stats=stats)
    if scale is None or bits >= 16:
        return restored
    if mode == "rtn":
        return quantize_rows(restored, scale, bits) * keep
    t = group_split(W.shape[1], alpha)
    out = gptq(restored, hessian, scale, bits, start=t, mask=keep, blocksize=blocksize)
    head_scale = scale[:, :t] if scale.dim() == 2 else scale  # per-entry (grouped) scales travel with columns
    out[:, :t] = quantize_rows(restored[:, :t], head_scale, bits) * keep[:, :t]
    return out
