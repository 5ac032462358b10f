"""Every restricted solver (OBR's restoration, issue 42) against the exact solution, per row x_A = H_AA⁻¹ H_AB v_B by
torch.linalg.solve, on random and on ill-conditioned Hessians (outlier channels, fewer tokens than columns, 1 %
damping: condition numbers ~1e5-1e6, like the layer Hessians of SmolLM2)."""

import pytest
import torch

from toolkit.compress.obr import obr_quantize, obr_restore
from toolkit.compress.quant import fit_weight_scale
from toolkit.compress.solvers import SOLVERS, damp_hessian, restricted_solve
from toolkit.core.errors import RunError
from toolkit.linalg.restricted import SolveStats, _woodbury_factors, auto_rank, deflation_basis, masked_pcg


def random_hessian(columns=160, tokens=2000, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(tokens, columns, generator=g, dtype=dtype)
    return damp_hessian(2 * X.T @ X / tokens, 0.01).H


def ill_conditioned_hessian(columns=160, tokens=120, seed=0, dtype=torch.float64):
    """Fewer tokens than columns (rank-deficient before damping), a decaying spectrum, three directions shared by
    every channel (massive activations) and four outlier channels 10x larger: after 1 % damping and Jacobi scaling,
    condition ~1e5 and a top eigenvalue ~100x the mean, as measured on SmolLM2's layer Hessians."""
    g = torch.Generator().manual_seed(seed)
    mix = torch.randn(columns, columns, generator=g, dtype=dtype) * torch.logspace(0, -2, columns, dtype=dtype)
    X = torch.randn(tokens, columns, generator=g, dtype=dtype) @ mix.T
    for amplitude in (100.0, 30.0, 10.0):
        X += amplitude * torch.randn(tokens, 1, generator=g, dtype=dtype) * torch.randn(1, columns, generator=g,
                                                                                        dtype=dtype)
    X[:, torch.randperm(columns, generator=g)[:4]] *= 10.0
    return damp_hessian(2 * X.T @ X / tokens, 0.01).H


def sets(rows, columns, seed=1, share=0.5):
    g = torch.Generator().manual_seed(seed)
    A = torch.rand(rows, columns, generator=g) >= share
    return A, ~A, torch.randn(rows, columns, generator=g, dtype=torch.float64)


def per_row_reference(H, A, B, V):
    out = torch.zeros(V.shape, dtype=H.dtype)
    for c in range(V.shape[0]):
        a, b = A[c], B[c]
        if a.any() and b.any():
            out[c, a] = torch.linalg.solve(H[a][:, a], H[a][:, b] @ V[c, b])
    return out


def excess(H, A, B, V, x, reference):
    """Relative excess of the layer loss Σ_rows dᵀHd, d = (x on A, −v on B), over the exact solution's."""
    def loss(solution):
        d = solution * A - V * B
        return float(((d @ H) * d).sum())
    return (loss(x) - loss(reference)) / loss(reference)


def test_ill_conditioned_fixture_is_ill_conditioned():
    H = ill_conditioned_hessian()
    scaled = torch.linalg.eigvalsh(H / torch.sqrt(torch.outer(torch.diag(H), torch.diag(H))))
    assert scaled[-1] / scaled[0] > 5e4  # what CG sees after Jacobi scaling
    assert scaled[-1] > 50 * scaled.mean()  # outlying eigenvalues: what the deflation preconditioner removes


@pytest.mark.parametrize("make", [random_hessian, ill_conditioned_hessian])
@pytest.mark.parametrize("method", SOLVERS)
def test_every_solver_converges_to_the_exact_solution(make, method):
    H = make()
    A, B, V = sets(24, H.shape[0])
    A[3] = False  # a row with nothing to solve
    B[3] = True
    reference = per_row_reference(H, A, B, V)
    options = {} if method == "cholesky" else {"tol": 1e-12, "stop": "residual"}
    x = restricted_solve(H, A, B, V, method=method, rank=16, block=32, **options)
    assert (x[~A] == 0).all()
    assert torch.allclose(x, reference, rtol=1e-6, atol=1e-8 * reference.abs().max())


@pytest.mark.parametrize("make", [random_hessian, ill_conditioned_hessian])
def test_the_obs_identity_equals_the_direct_cholesky(make):
    H = make()
    A, B, V = sets(16, H.shape[0], share=0.7)  # |B| > |A|: forced; then the other way round, chosen by size
    reference = per_row_reference(H, A, B, V)
    forced = restricted_solve(H, A, B, V, method="cholesky", obs=True)
    assert torch.allclose(forced, reference, rtol=1e-7, atol=1e-9 * reference.abs().max())
    A2, B2 = B, A
    stats = SolveStats()
    chosen = restricted_solve(H, A2, B2, V, method="cholesky", stats=stats)
    assert stats.method == "cholesky-obs"  # |B| < |A|: the identity factors the smaller side
    assert torch.allclose(chosen, per_row_reference(H, A2, B2, V), rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("make", [random_hessian, ill_conditioned_hessian])
@pytest.mark.parametrize("tol", [1e-2, 1e-3])
def test_the_default_cg_meets_its_layer_loss_tolerance(make, tol):
    """The stated tolerance holds against the exact solution: the layer loss is within tol of the optimum."""
    H = make(columns=192).float()
    A, B, V = sets(64, 192, seed=4)
    reference = per_row_reference(H.double(), A, B, V)
    stats = SolveStats()
    x = restricted_solve(H, A, B, V.float(), method="cg", tol=tol, stats=stats)
    assert 0 < stats.iterations < 192
    assert excess(H.double(), A, B, V, x.double(), reference) <= tol
    # and it did stop early: a tighter tolerance needs more steps
    tighter = SolveStats()
    restricted_solve(H, A, B, V.float(), method="cg", tol=tol / 100, stats=tighter)
    assert tighter.iterations > stats.iterations


def spiked_hessian(columns=256, tokens=1024, seed=0):
    """A flat bulk and a few directions shared by every channel, 100-1000x the mean eigenvalue: the shape of the
    Jacobi-scaled layer Hessians measured on SmolLM2 and the random-weight shapes (top eigenvalues 100-500x)."""
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(tokens, columns, generator=g, dtype=torch.float64)
    for amplitude in (30.0, 10.0, 5.0, 3.0):
        X += amplitude * torch.randn(tokens, 1, generator=g, dtype=torch.float64) * torch.randn(
            1, columns, generator=g, dtype=torch.float64)
    return damp_hessian(2 * X.T @ X / tokens, 0.01).H


def test_deflation_needs_far_fewer_iterations_than_jacobi_on_a_spiked_hessian():
    H = spiked_hessian().float()
    A, B, V = sets(32, 256, seed=2)
    counts = {}
    for method in ("cg", "cg-jacobi"):
        stats = SolveStats()
        restricted_solve(H, A, B, V.float(), method=method, tol=1e-3, stats=stats)
        counts[method] = stats.iterations
    assert counts["cg"] * 2 <= counts["cg-jacobi"], counts


def test_residual_stop_reaches_its_residual():
    H = ill_conditioned_hessian()
    A, B, V = sets(12, H.shape[0])
    stats = SolveStats()
    restricted_solve(H, A, B, V, method="cg", stop="residual", tol=1e-9, stats=stats)
    assert stats.residual <= 1e-9


def test_the_quantization_solve_uses_only_its_columns():
    """OBR's second solve: A inside columns ≥ t, B inside columns < t (H cut to A's columns): still exact."""
    H = ill_conditioned_hessian()
    A, B, V = sets(10, H.shape[0], seed=5)
    t = H.shape[0] // 2
    A[:, :t] = False
    B[:, t:] = False
    reference = per_row_reference(H, A, B, V)
    for method in SOLVERS:
        x = restricted_solve(H, A, B, V, method=method, tol=1e-12, stop="residual", rank=16, block=32)
        assert torch.allclose(x, reference, rtol=1e-6, atol=1e-8 * reference.abs().max()), method


def test_segments_stop_each_linear_on_its_own_loss():
    """Rows of two linears stacked: with segments, the criterion holds for each (the small-loss one included)."""
    H = ill_conditioned_hessian().float()
    A, B, V = sets(20, H.shape[0], seed=6)
    V[10:] *= 1e-3  # the second linear's loss is a millionth of the first's
    reference = per_row_reference(H.double(), A, B, V)
    x = restricted_solve(H, A, B, V.float(), method="cg", tol=1e-3, segments=[10, 10])
    second = slice(10, 20)
    assert excess(H.double(), A[second], B[second], V[second], x[second].double(), reference[second]) <= 1e-3


def test_deflation_basis_finds_the_top_eigenpairs():
    H = ill_conditioned_hessian()
    model = deflation_basis(H, 8)
    scale = torch.diag(H).rsqrt()
    values, vectors = torch.linalg.eigh(scale[:, None] * H * scale[None, :])
    # the three outlying eigenpairs exactly; the five from the bulk approximately (randomized subspace iteration)
    assert torch.allclose(model.K[-3:] + model.mu, values[-3:], rtol=1e-5)
    assert torch.allclose(model.K + model.mu, values[-8:], rtol=0.1)
    overlap = (model.V.T @ vectors[:, -3:]).abs().max(dim=0).values
    assert (overlap > 0.999).all()
    assert model.mu == pytest.approx(float((values.sum() - values[-8:].sum()) / (len(values) - 8)), rel=1e-2)
    smaller = model.truncated(4)
    assert smaller.V.shape[1] == 4 and torch.equal(smaller.V, model.V[:, -4:])
    assert smaller.mu == pytest.approx(float((values.sum() - values[-4:].sum()) / (len(values) - 4)), rel=1e-2)


def test_woodbury_factors_invert_the_restricted_model():
    """P = S (μI + V_A K V_Aᵀ)⁻¹ S on each row's set A, checked against an explicit inverse."""
    H = ill_conditioned_hessian(columns=48)
    model = deflation_basis(H, 6)
    A, _, V = sets(5, 48, seed=7)
    Minv = _woodbury_factors(model, A.double(), False)
    r = V * A
    for c in range(5):
        a = A[c]
        Va = model.V[a]
        explicit = torch.linalg.inv(model.mu * torch.eye(int(a.sum()), dtype=H.dtype) + Va @ torch.diag(model.K) @ Va.T)
        rs = r[c, a] * model.scale[a]
        expected = model.scale[a] * (explicit @ rs)
        woodbury = model.scale[a] * (rs - Va @ (Minv[c] @ (Va.T @ rs))) / model.mu
        assert torch.allclose(woodbury, expected, rtol=1e-8, atol=1e-12)


def test_auto_rank_rule():
    assert auto_rank(576) == 36 and auto_rank(100) == 16 and auto_rank(2048) == 64 and auto_rank(28672) == 64


def test_stats_split_the_time():
    H = random_hessian().float()
    A, B, V = sets(32, H.shape[0])
    stats = SolveStats()
    restricted_solve(H, A, B, V.float(), method="cg", stats=stats)
    assert stats.iterations > 0 and stats.seconds >= stats.product_seconds + stats.preconditioner_seconds
    assert stats.excess is not None and stats.excess <= 1e-3 and stats.extra["rank"] == auto_rank(H.shape[0])


def test_pcg_rejects_unknown_options():
    H = random_hessian(columns=32)
    A, _, V = sets(2, 32)
    with pytest.raises(ValueError):
        masked_pcg(H, A, V, preconditioner="nope")
    with pytest.raises(ValueError):
        masked_pcg(H, A, V, stop="never")
    with pytest.raises(ValueError):
        restricted_solve(H, A, ~A, V, method="lu")


def test_a_non_positive_definite_block_is_a_run_error():
    H = torch.eye(8, dtype=torch.float64)
    H[0, 1] = H[1, 0] = 2.0  # indefinite 2x2 principal block
    A = torch.zeros(1, 8, dtype=torch.bool)
    A[0, :2] = True
    with pytest.raises(RunError):
        restricted_solve(H, A, ~A, torch.ones(1, 8, dtype=torch.float64), method="cholesky")


@pytest.mark.parametrize("make", [random_hessian, ill_conditioned_hessian])
def test_obr_with_the_cg_solver_against_the_cholesky_one(make):
    """The whole OBR layer: the restoration meets its tolerance against the Cholesky restoration, and tightened,
    OBR_GPTQ's output gives the Cholesky path's layer loss. (At the default tolerance the quantized output may
    differ either way: rounding amplifies any difference; examples/scale/RESULTS.md measures it on real layers.)"""
    H = make(columns=128).float()
    hessian = damp_hessian(H, 0.0)
    g = torch.Generator().manual_seed(9)
    W = torch.randn(48, 128, generator=g)
    keep = W.abs() >= W.abs().median(dim=1, keepdim=True).values
    scale = fit_weight_scale(W, 4)

    def loss(Q):
        D = (W - Q).double()
        return float(((D @ H.double()) * D).sum())

    exact = loss(obr_restore(W, hessian, keep, None, 16, 0.5, "cholesky"))
    assert 0 <= loss(obr_restore(W, hessian, keep, None, 16, 0.5, "cg", tol=1e-3)) - exact <= 1e-3 * exact
    by_cg = obr_quantize(W, hessian, keep, scale, 4, alpha=0.5, mode="gptq", solver="cg", tol=1e-9)
    by_cholesky = obr_quantize(W, hessian, keep, scale, 4, alpha=0.5, mode="gptq", solver="cholesky")
    assert loss(by_cg) == pytest.approx(loss(by_cholesky), rel=1e-5)
    assert (by_cg[~keep] == 0).all()
