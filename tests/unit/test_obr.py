"""OBR's closed form against independent references (least squares, plain GPTQ, per-row loops)."""

import pytest
import torch

from toolkit.compress.masks import unstructured_mask, wanda_scores
from toolkit.compress.obr import group_split, obr_quantize, obr_restore
from toolkit.compress.quant import fit_weight_scale, quantize_rows
from toolkit.compress.solvers import damp_hessian, gptq, restricted_solve


def _problem(rows=12, columns=40, tokens=300, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    mix = torch.randn(columns, columns, generator=g, dtype=dtype) / columns ** 0.5 + torch.eye(columns, dtype=dtype)
    X = torch.randn(tokens, columns, generator=g, dtype=dtype) @ mix  # correlated inputs, like real activations
    W = torch.randn(rows, columns, generator=g, dtype=dtype)
    return W, X, 2.0 / tokens * X.t() @ X


def test_pruning_compensation_is_the_least_squares_solution():
    W, X, H = _problem()
    hessian = damp_hessian(H, 0.01)
    keep = unstructured_mask(torch.rand(W.shape, generator=torch.Generator().manual_seed(1)), 0.5)
    restored = obr_restore(W, hessian.H, keep, None, 16, alpha=0.5)
    n = X.shape[0]
    ridge = (hessian.damp * n / 2) ** 0.5
    for c in range(W.shape[0]):
        R = keep[c]
        A = torch.cat([X[:, R], ridge * torch.eye(int(R.sum()), dtype=W.dtype)])
        b = torch.cat([X @ W[c], ridge * W[c, R]])
        reference = torch.linalg.lstsq(A, b.unsqueeze(1)).solution.squeeze(1)
        assert torch.allclose(restored[c, R], reference, rtol=1e-6, atol=1e-8)
        assert (restored[c, ~R] == 0).all()


def test_restricted_solve_matches_a_per_row_loop_with_ragged_sets():
    W, _, H = _problem(rows=9, columns=24)
    g = torch.Generator().manual_seed(3)
    A = torch.rand(W.shape, generator=g) < 0.6
    B = ~A & (torch.rand(W.shape, generator=g) < 0.7)
    got = restricted_solve(H + torch.eye(24, dtype=H.dtype), A, B, W, max_bytes=24 * 24 * 8 * 2)
    Hd = H + torch.eye(24, dtype=H.dtype)
    for c in range(W.shape[0]):
        a, b = A[c], B[c]
        expected = torch.zeros(24, dtype=H.dtype)
        if a.any():
            expected[a] = torch.linalg.solve(Hd[a][:, a], Hd[a][:, b] @ W[c, b])
        assert torch.allclose(got[c], expected, atol=1e-10)


def test_obr_with_no_sparsity_and_alpha_zero_is_plain_gptq():
    W, _, H = _problem(columns=48)
    hessian = damp_hessian(H, 0.01)
    scale = fit_weight_scale(W, 4).double()
    keep = torch.ones_like(W, dtype=torch.bool)
    ours = obr_quantize(W, hessian, keep, scale, 4, alpha=0.0, mode="gptq", blocksize=16)
    plain = gptq(W, hessian, scale, 4, blocksize=16)
    assert torch.equal(ours, plain)


def _naive_gptq(W, H, scale, bits, start):
    """GPTQ by definition: quantize column i, then the OBS update over the still-free columns F = {i..C−1} with
    an explicitly inverted H_FF (no Cholesky trick)."""
    W = W.clone()
    for i in range(start, W.shape[1]):
        Hinv = torch.linalg.inv(H[i:, i:])
        q = quantize_rows(W[:, i:i + 1], scale, bits).squeeze(1)
        err = (W[:, i] - q) / Hinv[0, 0]
        W[:, i:] -= err.unsqueeze(1) * Hinv[0].unsqueeze(0)
        W[:, i] = q
    return W


@pytest.mark.parametrize("start", [0, 7, 29])
def test_gptq_from_any_start_column_matches_the_definition(start):
    W, _, H = _problem(rows=6, columns=36)
    hessian = damp_hessian(H, 0.01)
    scale = fit_weight_scale(W, 3).double()
    ours = gptq(W, hessian, scale, 3, start=start, blocksize=8)
    assert torch.allclose(ours, _naive_gptq(W, hessian.H, scale, 3, start), atol=1e-9)


def _layer_error(W, Q, H):
    D = W - Q
    return torch.trace(D @ H @ D.t()).item()


def test_quantization_compensation_lowers_the_layer_error():
    wins = 0
    for seed in range(6):
        W, _, H = _problem(rows=16, columns=64, seed=seed)
        hessian = damp_hessian(H, 0.01)
        scale = fit_weight_scale(W, 4).double()
        keep = unstructured_mask(wanda_scores(W, torch.diag(H) / 2), 0.5)
        obr_rtn = obr_quantize(W, hessian, keep, scale, 4, alpha=0.5, mode="rtn")
        plain = quantize_rows(W * keep, scale, 4)
        ours, base = _layer_error(W, obr_rtn, H), _layer_error(W, plain, H)
        assert ours <= base
        wins += ours < 0.999 * base
    assert wins == 6


@pytest.mark.parametrize("alpha", [0.3, 0.5, 0.77])
def test_obr_gptq_any_alpha_keeps_every_kept_weight_on_the_grid(alpha):
    W, _, H = _problem(rows=10, columns=40)
    hessian = damp_hessian(H, 0.01)
    scale = fit_weight_scale(W, 4).double()
    keep = unstructured_mask(W.abs(), 0.5)
    out = obr_quantize(W, hessian, keep, scale, 4, alpha=alpha, mode="gptq", blocksize=16)
    assert (out[~keep] == 0).all()
    codes = out / scale.reshape(-1, 1)
    assert torch.allclose(codes, codes.round(), atol=1e-9)
    t = group_split(40, alpha)
    kept_columns = keep.any(dim=0)
    assert (out[:, kept_columns].abs().sum(dim=0) > 0).all()  # the official code leaves whole blocks at zero
    assert out[:, t:].abs().sum() > 0


def test_obr_gptq_layer_error_is_below_mask_then_rtn():
    W, _, H = _problem(rows=16, columns=64, seed=7)
    hessian = damp_hessian(H, 0.01)
    scale = fit_weight_scale(W, 4).double()
    keep = unstructured_mask(wanda_scores(W, torch.diag(H) / 2), 0.5)
    obr = obr_quantize(W, hessian, keep, scale, 4, alpha=0.5, mode="gptq")
    rtn = quantize_rows(W * keep, scale, 4)
    assert _layer_error(W, obr, H) < _layer_error(W, rtn, H)


@pytest.mark.parametrize("dtype,atol", [(torch.float64, 1e-9), (torch.float32, 1e-3)])
def test_conjugate_gradient_solve_matches_cholesky_on_an_ill_conditioned_hessian(dtype, atol):
    g = torch.Generator().manual_seed(5)
    X = torch.randn(400, 40, generator=g, dtype=torch.float64) @ torch.diag(torch.logspace(0, 2, 40, dtype=torch.float64))
    H = (2 * X.T @ X / 400 + 0.01 * torch.eye(40, dtype=torch.float64)).to(dtype)
    W = torch.randn(12, 40, generator=g, dtype=torch.float64).to(dtype)
    A = torch.rand(W.shape, generator=g) < 0.5
    A[0] = False  # a row with nothing to solve
    exact = restricted_solve(H, A, ~A, W, method="cholesky")
    iterative = restricted_solve(H, A, ~A, W, method="cg", stop="residual")  # the default stops on the layer loss
    assert (iterative[~A] == 0).all()
    assert (iterative - exact).abs().max() <= atol * exact.abs().max()


def test_obr_solvers_agree_on_the_layer_loss():
    W, X, H = _problem(rows=16, columns=64)
    hessian = damp_hessian(H, 0.01)
    scale = fit_weight_scale(W, 4).double()
    keep = W.abs() >= W.abs().median(dim=1, keepdim=True).values
    by_cg = obr_quantize(W, hessian, keep, scale, 4, alpha=0.5, mode="gptq", solver="cg")
    by_cholesky = obr_quantize(W, hessian, keep, scale, 4, alpha=0.5, mode="gptq", solver="cholesky")
    loss = lambda Q: ((X @ (Q - W).T) ** 2).sum().item()  # noqa: E731
    assert loss(by_cg) == pytest.approx(loss(by_cholesky), rel=1e-6)
