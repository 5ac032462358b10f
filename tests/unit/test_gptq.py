"""GPTQ / SparseGPT / damping behaviour on random problems."""

import pytest
import torch

from toolkit.compress.quant import fit_weight_scale, quantize_rows
from toolkit.compress.solvers import damp_hessian, gptq, sparsegpt
from toolkit.core.errors import RunError


def _problem(rows=8, columns=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(200, columns, generator=g, dtype=torch.float64) @ (
        torch.eye(columns, dtype=torch.float64) + 0.3 * torch.randn(columns, columns, generator=g, dtype=torch.float64))
    return torch.randn(rows, columns, generator=g, dtype=torch.float64), 2 / 200 * X.t() @ X


def test_gptq_lazy_batches_do_not_change_the_result():
    W, H = _problem()
    hessian = damp_hessian(H)
    scale = fit_weight_scale(W, 4).double()
    assert torch.allclose(gptq(W, hessian, scale, 4, blocksize=1), gptq(W, hessian, scale, 4, blocksize=128))


def test_gptq_error_below_rtn():
    W, H = _problem(seed=1)
    hessian = damp_hessian(H)
    scale = fit_weight_scale(W, 3).double()
    err = lambda Q: torch.trace((W - Q) @ H @ (W - Q).t())
    assert err(gptq(W, hessian, scale, 3)) < err(quantize_rows(W, scale, 3))


@pytest.mark.parametrize("nm", [(2, 4), (4, 8)])
def test_sparsegpt_nm_is_valid_after_quantization(nm):
    W, H = _problem(columns=32, seed=2)
    out, keep = sparsegpt(W, damp_hessian(H), fit_weight_scale(W, 4).double(), 4, 0.5, nm, blocksize=16)
    nonzero = (out != 0).reshape(W.shape[0], -1, nm[1]).sum(dim=2)
    assert (nonzero <= nm[1] - nm[0]).all()
    assert ((~keep).reshape(W.shape[0], -1, nm[1]).sum(dim=2) == nm[0]).all()


def test_sparsegpt_unstructured_share():
    W, H = _problem(rows=16, columns=64, seed=3)
    out, keep = sparsegpt(W, damp_hessian(H), None, 16, 0.5, None, blocksize=32)
    assert abs((~keep).float().mean().item() - 0.5) < 0.01
    assert (out[~keep] == 0).all()


def test_dead_inputs_and_nan_hessians():
    W, H = _problem(seed=4)
    H[3, :] = 0
    H[:, 3] = 0
    hessian = damp_hessian(H)
    assert hessian.dead[3] and hessian.H[3, 3] > 0
    assert (gptq(W, hessian, None, 16)[:, 3] == 0).all()
    H[0, 0] = float("nan")
    with pytest.raises(RunError):
        damp_hessian(H)
