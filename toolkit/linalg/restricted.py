"""Batched restricted solves: for many rows at once, x_A = H_AA⁻¹ rhs_A where each row has its own column set A
(a boolean mask) and H is one symmetric positive definite matrix (a damped layer Hessian). This is OBR's
restoration (toolkit/compress/obr.py): every output row keeps a different half of the columns, so every row is a
different system, and a direct solve costs one Cholesky of |A| ≈ C/2 per row.

Two solvers:

- `cholesky_solve_rows`: exact, one batched Cholesky per chunk of rows (each row's H_AA gathered and padded with an
  identity). With `complement=True` and complementary sets (B = not A) it uses the OBS identity instead,
  x_A = −G_AB (G_BB)⁻¹ v_B with G = H⁻¹, which factors |B| × |B| blocks: the smaller side is factored.
- `masked_pcg`: preconditioned conjugate gradients on all rows together: one (rows × C) @ (C × C) product per
  iteration. The preconditioner (default "deflation") models the Jacobi-scaled Hessian D^-½ H D^-½ as
  μI + V (Λ − μ) Vᵀ with V, Λ its top-k eigenpairs (randomized subspace iteration, fixed seed) and μ the mean of
  the rest of the spectrum, restricts that model to each row's set A and inverts it exactly per row by Woodbury
  (a k × k matrix per row). Layer Hessians have a few eigenvalues hundreds of times the mean (measured on SmolLM2
  and on random-weight Llamas, examples/scale/SOLVERS.md): removing them cuts CG's iterations 4-8x against the
  Jacobi preconditioner.

Stopping (`tol`, `stop="loss"`): CG minimises f(x) = xᵀH_AAx − 2 rhsᵀx, and for OBR's systems f plus a constant
is exactly the layer loss (δᵀHδ summed over the rows), so the solver tracks it: each step lowers it by
α·pᵀr. The run stops when the decrease over the last `window` steps (the Hestenes–Stiefel lower estimate of the
remaining excess) is at most `tol` times the current loss, per segment of rows (one segment per linear). With
`stop="residual"` it stops at ‖r‖ ≤ tol·‖rhs‖ per row (the criterion before issue 42).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from toolkit.core.errors import RunError
from toolkit.linalg.padded import cholesky_blocks, padded_indices, triangular_solves


@dataclass
class SolveStats:
    """What one restricted solve did: iterations, CPU seconds split (products with H, preconditioner application,
    setup = basis + per-row factors, the rest), the relative residual reached (max over rows, ‖r‖/‖rhs‖) and the
    estimated relative excess of the layer loss at the stop."""

    method: str = ""
    rows: int = 0
    columns: int = 0
    iterations: int = 0
    seconds: float = 0.0
    product_seconds: float = 0.0
    preconditioner_seconds: float = 0.0
    setup_seconds: float = 0.0
    residual: float = 0.0
    excess: float | None = None
    loss: float | None = None
    extra: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        out = {k: v for k, v in self.__dict__.items() if k != "extra"}
        out.update(self.extra)
        return out


class _Clock:
    """CPU-time (or, on CUDA, synchronised wall-time) accumulation for SolveStats; free when not recording."""

    def __init__(self, enabled: bool, device: torch.device):
        self.enabled = enabled
        self.cuda = device.type == "cuda"

    def now(self) -> float:
        if not self.enabled:
            return 0.0
        if self.cuda:
            torch.cuda.synchronize()
            return time.perf_counter()
        return time.process_time()


# -- the deflation model of H ---------------------------------------------------------------------------------------

@dataclass
class Deflation:
    """D^-½ H D^-½ ≈ μI + V diag(K) Vᵀ (K = Λ − μ > 0): `scale` = diag(H)^-½, V [C, k] orthonormal."""

    scale: torch.Tensor
    V: torch.Tensor
    K: torch.Tensor
    mu: float

    def restricted(self, support: torch.Tensor | None) -> Deflation:
        """The same model on the columns `support` (a sorted index tensor) of H."""
        if support is None:
            return self
        return Deflation(self.scale[support], self.V[support], self.K, self.mu)

    def truncated(self, rank: int) -> Deflation:
        """The model with only the top `rank` eigenpairs (μ re-estimated: the dropped ones join the rest)."""
        kept = self.V.shape[1]
        if rank >= kept:
            return self
        C = self.V.shape[0]
        top = self.K + self.mu  # the eigenvalues, ascending
        mu = (self.mu * (C - kept) + float(top[:kept - rank].sum())) / (C - rank)
        K = top[kept - rank:] - mu
        keep = K > 0
        return Deflation(self.scale, self.V[:, kept - rank:][:, keep].contiguous(), K[keep], mu)


def auto_rank(columns: int) -> int:
    """The deflation rank for a system over `columns` columns: columns/16 within [16, 64]. Its set-up (one
    (rows × C) @ (C × k²/2) product and a k × k Cholesky per row) costs about k²/(4C) CG iterations plus a fixed
    per-row share; on SmolLM2 and the random 135M-1.1B shapes, rank 64 saves 2-4 iterations over 32 on wide
    layers and costs more than it saves on C = 576 (examples/scale/RESULTS.md)."""
    return max(16, min(64, columns // 16))


def deflation_basis(H: torch.Tensor, rank: int, oversample: int = 16, power: int = 2, seed: int = 0) -> Deflation:
    """Top-`rank` eigenpairs of the Jacobi-scaled H by randomized subspace iteration (`power` passes, `oversample`
    extra vectors, a fixed seed: deterministic per device), and μ = the mean of the other eigenvalues
    ((trace − Σ top) / (C − rank)). Eigenpairs whose eigenvalue is not above μ are dropped."""
    C = H.shape[0]
    scale = torch.diag(H).rsqrt()
    rank = max(0, min(rank, C - 1))
    if rank == 0:
        return Deflation(scale, H.new_zeros(C, 0), H.new_zeros(0), 1.0)
    Hs = scale.unsqueeze(1) * H * scale.unsqueeze(0)
    width = min(C, rank + oversample)
    generator = torch.Generator(device=H.device).manual_seed(seed)
    Q = torch.linalg.qr(Hs @ torch.randn(C, width, generator=generator, device=H.device, dtype=H.dtype))[0]
    for _ in range(power):
        Q = torch.linalg.qr(Hs @ Q)[0]
    values, vectors = torch.linalg.eigh(Q.T @ Hs @ Q)
    values, V = values[-rank:], Q @ vectors[:, -rank:]
    mu = float((torch.diagonal(Hs).sum() - values.sum()) / (C - rank))
    mu = max(mu, float(values.min()) * 1e-6, torch.finfo(H.dtype).tiny)
    keep = values > mu
    return Deflation(scale, V[:, keep].contiguous(), (values[keep] - mu), mu)


def _woodbury_factors(model: Deflation, mask: torch.Tensor, low_precision: bool) -> torch.Tensor:
    """Per row c, M_c⁻¹ with M_c = μ K⁻¹ + V_Aᵀ V_A (k × k), A = the row's mask: the Woodbury core of
    (μI + V_A K V_Aᵀ)⁻¹ = (I − V_A M_c⁻¹ V_Aᵀ)/μ. One GEMM (rows × C) @ (C × k(k+1)/2) builds all the V_AᵀV_A."""
    V = model.V
    k = V.shape[1]
    iu = torch.triu_indices(k, k, device=V.device)
    pairs = V[:, iu[0]] * V[:, iu[1]]  # [C, k(k+1)/2]
    upper, lower = iu[0] * k + iu[1], iu[1] * k + iu[0]

    def cores(select):
        if low_precision and V.device.type == "cpu":  # a study candidate: it makes P indefinite (RESULTS.md)
            gram = (select.to(torch.bfloat16) @ pairs.to(torch.bfloat16)).to(V.dtype)
        else:
            gram = select.to(V.dtype) @ pairs
        M = V.new_empty(select.shape[0], k * k)
        M.index_copy_(1, upper, gram)
        M.index_copy_(1, lower, gram)
        M = M.view(-1, k, k)
        M.diagonal(dim1=1, dim2=2).add_(model.mu / model.K)
        return M

    L, info = torch.linalg.cholesky_ex(cores(mask))
    if (info != 0).any():
        raise RunError("the deflation preconditioner's Woodbury core is not positive definite",
                       "use --set solver=cholesky or raise percdamp")
    return torch.cholesky_inverse(L)


# -- conjugate gradients ----------------------------------------------------------------------------------------

# long: one preconditioned CG loop; its iterates, residuals, loss window and stats share every step
def masked_pcg(H: torch.Tensor, A: torch.Tensor, rhs: torch.Tensor, *, loss0: torch.Tensor | None = None,
               tol: float = 1e-3, stop: str = "loss", window: int = 3, max_iter: int | None = None,
               preconditioner: str = "deflation", deflation: Deflation | None = None, rank: int | None = None,
               inverse: torch.Tensor | None = None, block: int = 64, segments: list[int] | None = None,
               low_precision_setup: bool = False, product: str = "full", refresh: int = 0,
               stats: SolveStats | None = None) -> torch.Tensor:
    """x with x_A = H_AA⁻¹ rhs_A for every row (zero outside A), all rows at once.

    H [C, C] SPD; A [rows, C] bool; rhs [rows, C] (only its A entries are read). loss0 [rows]: each row's loss at
    x = 0 (the layer loss before this correction, for `stop="loss"`; default 0, i.e. relative to the decrease).
    preconditioner: "deflation" (default; `deflation` a precomputed model of H or None to build one; `rank` its
    rank, default auto_rank(C)),
    "jacobi", "inverse" (the restriction of H⁻¹ to A: `inverse` = H⁻¹) or "block-jacobi" (each row's H_AA cut
    into diagonal blocks of `block` consecutive columns, each factored exactly: rows × C × block floats of
    factors, for studies on row subsets). segments: row counts of the linears
    stacked in the rows (the loss criterion holds per segment); None = one.

    product: "full" (H's dtype, the default), or — measured and rejected (examples/scale/RESULTS.md: the layer
    loss diverges on SmolLM2's o_proj) — "bf16" (one bfloat16 product, 6x faster on AMX CPUs) or "bf16x3" (three,
    hi/lo split); `refresh` > 0 recomputes the residual in full precision every `refresh` steps."""
    clock = _Clock(stats is not None, H.device)
    started = clock.now()
    dtype = H.dtype
    rows, C = A.shape
    mask = A.to(dtype)
    residual = rhs.to(dtype) * mask
    x = torch.zeros_like(residual)
    max_iter = max_iter or C
    setup0 = clock.now()
    apply = _preconditioner(preconditioner, H, A, mask, deflation, rank, inverse, block, low_precision_setup)
    if product == "full":
        multiply = H.__rmatmul__
    elif product in ("bf16", "bf16x3"):
        high = H.to(torch.bfloat16)
        low = (H - high.to(dtype)).to(torch.bfloat16)

        def multiply(d):
            top = d.to(torch.bfloat16)
            out = (top @ high).to(dtype)
            if product == "bf16x3":
                out += (top @ low).to(dtype) + ((d - top.to(dtype)).to(torch.bfloat16) @ high).to(dtype)
            return out
    else:
        raise ValueError(f"unknown product {product!r} (full | bf16 | bf16x3)")
    setup = clock.now() - setup0
    product_seconds = precond = 0.0

    bounds = _segment_bounds(rows, segments)
    accumulate = torch.float64 if dtype != torch.float64 and H.device.type != "mps" else dtype
    loss = (loss0.to(accumulate) if loss0 is not None else torch.zeros(rows, dtype=accumulate, device=H.device))
    decreases: list[torch.Tensor] = []
    rhs_norm = residual.norm(dim=1)
    t = clock.now()
    z = apply(residual)
    precond += clock.now() - t
    direction = z.clone()
    rz = torch.linalg.vecdot(residual, z).unsqueeze(1)
    active = (rhs_norm > 0).unsqueeze(1)
    if stop == "residual":
        target = (tol * rhs_norm).square().unsqueeze(1)
        active = active & (residual.square().sum(dim=1, keepdim=True) > target)
    elif stop != "loss":
        raise ValueError(f"unknown stop {stop!r} (loss | residual)")
    iterations = 0
    excess = None
    for iterations in range(1, max_iter + 1):
        if not active.any():
            iterations -= 1
            break
        t = clock.now()
        Hd = multiply(direction).mul_(mask)
        product_seconds += clock.now() - t
        curvature = torch.linalg.vecdot(direction, Hd).unsqueeze(1)
        ok = active & (curvature > 0)
        # rᵀz = pᵀr in exact arithmetic: α = rᵀz / pᵀHp, and f falls by α·rᵀz
        step = torch.where(ok, rz / torch.where(ok, curvature, 1.0), 0.0)
        x.addcmul_(step, direction)
        residual.addcmul_(step, Hd, value=-1.0)
        if refresh and iterations % refresh == 0:
            residual = (rhs.to(dtype) - x @ H).mul_(mask)
        decrease = (step * rz).squeeze(1).to(accumulate)
        loss = loss - decrease
        t = clock.now()
        z = apply(residual)
        precond += clock.now() - t
        rz_next = torch.linalg.vecdot(residual, z).unsqueeze(1)
        beta = torch.where(ok, rz_next / torch.where(ok, rz, 1.0), 0.0)
        direction = z.addcmul_(beta, direction)  # z is not needed again: its buffer becomes the direction
        rz = rz_next
        if stop == "residual":
            active = active & (residual.square().sum(dim=1, keepdim=True) > target)
            continue
        decreases.append(decrease)
        if len(decreases) > window:
            decreases.pop(0)
        if len(decreases) == window:
            recent = torch.stack(decreases).sum(dim=0)
            ratios = []
            for r0, r1 in bounds:
                current = float(loss[r0:r1].sum())
                ratio = float(recent[r0:r1].sum()) / current if current > 0 else 0.0
                ratios.append(ratio)
                if ratio <= tol:  # this linear's loss has stopped improving: its rows are done
                    active[r0:r1] = False
            excess = max(ratios)
    if stats is not None:
        stats.method = f"pcg-{preconditioner}"
        stats.rows, stats.columns = rows, C
        stats.iterations += iterations
        stats.product_seconds += product_seconds
        stats.preconditioner_seconds += precond
        stats.setup_seconds += setup
        stats.seconds += clock.now() - started
        norms = residual.norm(dim=1) / rhs_norm.clamp_min(torch.finfo(dtype).tiny)
        stats.residual = max(stats.residual, float(norms.max()) if rows else 0.0)
        stats.excess = excess
        stats.loss = float(loss.sum())
        if preconditioner == "deflation":
            stats.extra["rank"] = int(getattr(apply, "rank", 0))
    return x


def _preconditioner(kind: str, H, A, mask, deflation, rank, inverse, block, low_precision_setup):
    """z = P r for r zero outside A (and z zero outside A)."""
    dtype = H.dtype
    if kind == "deflation":
        rank = rank if rank is not None else auto_rank(H.shape[0])
        model = (deflation if deflation is not None else deflation_basis(H, rank)).truncated(rank)
        s, V, mu = model.scale, model.V, model.mu
        diagonal = s * s / mu  # P r = [r ⊙ s²/μ − (M⁻¹ (r ⊙ s) V)(V ⊙ s/μ)ᵀ] ⊙ mask
        if not V.shape[1]:
            def apply(r):
                return (r * diagonal).mul_(mask)
        else:
            Minv = _woodbury_factors(model, mask, low_precision_setup)
            left, right = V * s.unsqueeze(1), (V * (s / mu).unsqueeze(1)).T.contiguous()

            def apply(r):
                y = torch.bmm(Minv, (r @ left).unsqueeze(2)).squeeze(2)
                return torch.addmm(r * diagonal, y, right, alpha=-1.0).mul_(mask)
        apply.rank = V.shape[1]
        return apply
    if kind == "jacobi":
        inverse_diagonal = mask / torch.diag(H).unsqueeze(0)
        return lambda r: r * inverse_diagonal
    if kind == "inverse":
        G = inverse if inverse is not None else torch.cholesky_inverse(torch.linalg.cholesky(H))
        return lambda r: (r @ G).mul_(mask)
    if kind == "block-jacobi":
        blocks = []
        for b0 in range(0, H.shape[0], block):
            b1 = min(b0 + block, H.shape[0])
            idx, valid = padded_indices(A[:, b0:b1])
            if idx.shape[1]:
                blocks.append((b0, idx, valid.to(dtype), cholesky_blocks(H[b0:b0 + block, b0:b0 + block], idx, valid)))

        def apply(r):
            out = torch.zeros_like(r)
            for b0, idx, valid, L in blocks:
                part = torch.gather(r[:, b0:b0 + block], 1, idx) * valid
                out[:, b0:b0 + block].scatter_(1, idx, triangular_solves(L, part) * valid)
            return out
        return apply
    raise ValueError(f"unknown preconditioner {kind!r}")


def _segment_bounds(rows: int, segments: list[int] | None) -> list[tuple[int, int]]:
    if not segments:
        return [(0, rows)]
    bounds, start = [], 0
    for count in segments:
        bounds.append((start, start + count))
        start += count
    if start != rows:
        raise ValueError(f"segments add up to {start}, not to the {rows} rows")
    return bounds
