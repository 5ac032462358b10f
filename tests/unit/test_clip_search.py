"""The MSE clip search: the full scan equals an independent loop written from GPTQ's reference `find_params`
(grid 100, max shrink 0.8, norm 2.4) bit for bit; the coarse scan never does worse than the stride's own grid, picks
the full scan's ratio where the error curve has one minimum, and is wired through `w_clip_search`."""

import pytest
import torch

from toolkit.compress.quant import COARSE_STRIDE, fit_grid, fit_weight_scale, max_code


def reference_scale(W, bits, grid=100, maxshrink=0.8, norm=2.4):
    W = W.float()
    xmax = W.abs().amax(dim=1).clamp(min=1e-8)
    best_scale, best_err = xmax / max_code(bits), torch.full_like(xmax, float("inf"))
    for i in range(int(maxshrink * grid)):
        scale = (1 - i / grid) * xmax / max_code(bits)
        q = torch.clamp(torch.round(W / scale[:, None]), -max_code(bits) - 1, max_code(bits)) * scale[:, None]
        err = (q - W).abs().pow(norm).sum(dim=1)
        better = err < best_err
        best_err, best_scale = torch.where(better, err, best_err), torch.where(better, scale, best_scale)
    return best_scale


def row_error(W, scale, bits, norm=2.4):
    q = torch.clamp(torch.round(W / scale[:, None]), -max_code(bits) - 1, max_code(bits)) * scale[:, None]
    return (q - W).abs().pow(norm).sum(dim=1)


def heavy_tailed(seed, rows=96, columns=160):
    g = torch.Generator().manual_seed(seed)
    W = torch.randn(rows, columns, generator=g) * torch.rand(rows, 1, generator=g)
    W[::4] *= torch.randn(rows // 4, columns, generator=g).abs().pow(2)
    return W


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_full_scan_is_the_reference_bit_for_bit(bits, seed):
    W = heavy_tailed(seed)
    assert torch.equal(fit_weight_scale(W, bits), reference_scale(W, bits))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_coarse_scan_is_no_worse_than_its_stride_grid_and_mostly_the_full_choice(seed):
    W = heavy_tailed(seed)
    full, coarse = fit_weight_scale(W, 4), fit_weight_scale(W, 4, search="coarse")
    err_full, err_coarse = row_error(W, full, 4), row_error(W, coarse, 4)
    assert (err_coarse >= err_full).all()  # the full scan is the optimum over the candidates
    xmax = W.abs().amax(dim=1)
    strided = torch.stack([row_error(W, (1 - i / 100) * xmax / 7, 4) for i in range(0, 80, COARSE_STRIDE)])
    assert (err_coarse <= strided.min(dim=0).values).all()  # the refinement only improves on the coarse pass
    assert (coarse == full).float().mean() >= 0.8
    assert (err_coarse / err_full).max() < 1.05


def test_coarse_scan_finds_a_unimodal_rows_minimum_exactly():
    """A row of evenly spread weights has one minimum: the coarse scan returns the full scan's ratio."""
    W = torch.linspace(-1, 1, 257).repeat(4, 1) * torch.tensor([[1.0], [0.5], [2.0], [3.0]])
    assert torch.equal(fit_weight_scale(W, 4, search="coarse"), fit_weight_scale(W, 4))


def test_grouped_grids_and_config_take_the_search():
    from toolkit.compress.config import GptqConfig

    W = heavy_tailed(3)
    grid = fit_grid(W, 4, group_size=32, search="coarse")
    assert grid.scales.shape == (96, 5)
    assert GptqConfig(model="m", w_clip_search="coarse").w_clip_search == "coarse"
    with pytest.raises(ValueError):
        fit_weight_scale(W, 4, search="golden")
