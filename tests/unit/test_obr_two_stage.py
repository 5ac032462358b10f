"""The two-stage SparseGPT → GPTQ baseline: the SparseGPT mask survives GPTQ and the scales are refit on the sparse
weights."""

import pytest
import torch

from toolkit.compress.config import SparsegptGptqConfig
from toolkit.compress.masks import parse_nm
from toolkit.compress.quant import fit_grid, quantize_rows
from toolkit.compress.recipe import compress_linear
from toolkit.compress.solvers import damp_hessian, sparsegpt


def _problem(rows=24, columns=96, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(400, columns, generator=g) * torch.exp(torch.randn(columns, generator=g))
    return torch.randn(rows, columns, generator=g), 2 / 400 * X.t() @ X


@pytest.mark.parametrize("nm,group_size,actorder", [(None, None, "static"), (None, 32, "group"), ("2:4", None, "none"),
                                                    (None, 32, "static")])
def test_mask_survives_gptq_and_scales_are_refit_on_the_sparse_weights(nm, group_size, actorder):
    W, H = _problem()
    config = SparsegptGptqConfig(model="unused", nm=nm, group_size=group_size, actorder=actorder, blocksize=32)
    out, keep, grid = compress_linear(W, H, config, config.percdamp)
    pruned, expected_keep = sparsegpt(W, damp_hessian(H, config.percdamp), None, 16, 0.5, parse_nm(nm), 32)
    assert torch.equal(keep, expected_keep)  # the kept set is SparseGPT's mask
    assert (out[~keep] == 0).all() and (out[keep] != 0).float().mean() > 0.9  # pruned entries exactly zero
    order = torch.argsort(torch.diag(H), descending=True, stable=True) if actorder == "group" else None
    assert torch.equal(grid.scales, fit_grid(pruned, 4, True, group_size, order).scales)
    dense_grid = fit_grid(W, 4, True, group_size)
    assert not torch.equal(grid.scales, dense_grid.scales)  # refit: not the dense weights' scales
    scale = grid.per_column(W.shape[1])
    assert torch.equal(quantize_rows(out, scale, 4), out)  # on the refit grid
    if nm:
        assert ((out != 0).reshape(24, -1, 4).sum(dim=2) <= 2).all()


def test_two_stage_beats_pruning_then_rounding():
    W, H = _problem(seed=1)
    config = SparsegptGptqConfig(model="unused", blocksize=32)
    out, keep, grid = compress_linear(W, H, config, config.percdamp)
    pruned, _ = sparsegpt(W, damp_hessian(H, config.percdamp), None, 16, 0.5, None, 32)
    rounded = quantize_rows(pruned, grid.per_column(W.shape[1]), 4)
    loss = lambda Q: torch.trace((W - Q) @ H @ (W - Q).t()).item()
    assert loss(out) < loss(rounded)
