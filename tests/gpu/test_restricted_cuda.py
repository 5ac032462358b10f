"""OBR's restoration solvers on CUDA (issue 42: `--device cuda` runs the same deflation-preconditioned CG) against the
float64 per-row exact solution computed on the CPU."""

import torch

from toolkit.compress.solvers import damp_hessian, restricted_solve
from toolkit.linalg.restricted import SolveStats


def _problem(columns=512, tokens=384, rows=96, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(tokens, columns, generator=g, dtype=torch.float64)
    X += 20.0 * torch.randn(tokens, 1, generator=g, dtype=torch.float64) * torch.randn(1, columns, generator=g,
                                                                                       dtype=torch.float64)
    H = damp_hessian(2 * X.T @ X / tokens, 0.01).H
    A = torch.rand(rows, columns, generator=g) >= 0.5
    V = torch.randn(rows, columns, generator=g, dtype=torch.float64)
    return H, A, V


def _loss(H, A, V, x):
    d = x * A - V * ~A
    return float(((d @ H) * d).sum())


def test_cg_on_cuda_meets_its_tolerance_against_the_exact_solution():
    H, A, V = _problem()
    exact = restricted_solve(H, A, ~A, V, method="cholesky")
    stats = SolveStats()
    x = restricted_solve(H.float().cuda(), A.cuda(), ~A.cuda(), V.float().cuda(), method="cg", tol=1e-3,
                         stats=stats)
    assert x.device.type == "cuda" and stats.iterations > 0
    excess = (_loss(H, A, V, x.double().cpu()) - _loss(H, A, V, exact)) / _loss(H, A, V, exact)
    assert 0 <= excess <= 1e-3


def test_cholesky_on_cuda_is_exact():
    H, A, V = _problem(columns=256, rows=32)
    exact = restricted_solve(H, A, ~A, V, method="cholesky")
    on_gpu = restricted_solve(H.cuda(), A.cuda(), ~A.cuda(), V.cuda(), method="cholesky")
    assert torch.allclose(on_gpu.cpu(), exact, rtol=1e-8, atol=1e-10 * exact.abs().max())
