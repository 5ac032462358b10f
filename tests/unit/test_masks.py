"""Masks and quantizers against direct definitions."""

import pytest
import torch

from toolkit.compress.masks import (
    make_mask,
    nm_mask,
    parse_nm,
    unstructured_mask,
    wanda_scores,
)
from toolkit.compress.quant import (
    codes_of,
    fake_quant_asym,
    fake_quant_per_token,
    fit_weight_scale,
    quantize_rows,
)
from toolkit.core.errors import BadInputError
from toolkit.linalg.hessian import HessianAccumulator


@pytest.mark.parametrize("n,m", [(2, 4), (4, 8)])
def test_nm_mask_prunes_exactly_n_lowest_per_group(n, m):
    scores = torch.rand(6, 32, generator=torch.Generator().manual_seed(0))
    keep = nm_mask(scores, n, m)
    groups, kept = scores.reshape(6, -1, m), keep.reshape(6, -1, m)
    assert ((~kept).sum(dim=2) == n).all()
    for r in range(6):
        for g in range(groups.shape[1]):
            assert groups[r, g][~kept[r, g]].max() <= groups[r, g][kept[r, g]].min()


def test_unstructured_mask_drops_the_lowest_share_per_row():
    scores = torch.rand(5, 50, generator=torch.Generator().manual_seed(1))
    keep = unstructured_mask(scores, 0.3)
    assert ((~keep).sum(dim=1) == 15).all()
    for r in range(5):
        assert scores[r][~keep[r]].max() < scores[r][keep[r]].min()


def test_wanda_statistic_is_an_exact_mean_over_uneven_batches():
    g = torch.Generator().manual_seed(2)
    batches = [torch.randn(n, 8, generator=g, dtype=torch.float64) for n in (3, 17, 1, 40)]
    accumulator = HessianAccumulator(8)
    for batch in batches:
        accumulator.add(batch)
    mean_sq = torch.cat(batches).pow(2).mean(dim=0)
    assert torch.allclose(torch.diag(accumulator.H) / 2, mean_sq)
    W = torch.randn(4, 8, generator=g, dtype=torch.float64)
    assert torch.allclose(wanda_scores(W, torch.diag(accumulator.H) / 2), W.abs() * mean_sq.sqrt())


def test_symmetric_quantizer_keeps_pruned_zeros_and_stays_on_grid():
    W = torch.randn(8, 64, generator=torch.Generator().manual_seed(3))
    keep = make_mask(W.abs(), 0.5, None)
    for bits in (2, 3, 4, 8):
        scale = fit_weight_scale(W, bits)
        Q = quantize_rows(W * keep, scale, bits)
        assert (Q[~keep] == 0).all()
        codes = codes_of(W, scale, bits)
        assert codes.min() >= -(2 ** (bits - 1)) and codes.max() <= 2 ** (bits - 1) - 1


def test_mse_clip_search_never_worse_than_max_scaling():
    W = torch.randn(16, 128, generator=torch.Generator().manual_seed(4)) ** 3  # heavy tails: clipping pays
    plain = fit_weight_scale(W, 4, mse=False)
    clipped = fit_weight_scale(W, 4)
    err = lambda s: (quantize_rows(W, s, 4) - W).abs().pow(2.4).sum(dim=1)
    assert (err(clipped) <= err(plain) + 1e-6).all()
    assert (clipped < plain).any()


def test_activation_and_kv_fake_quant_levels():
    x = torch.randn(3, 5, 16, generator=torch.Generator().manual_seed(5))
    q = fake_quant_per_token(x, 4)
    step = x.abs().amax(dim=-1, keepdim=True) / 7
    assert torch.allclose(q / step, (q / step).round(), atol=1e-4)
    assert (q - x).abs().max() <= step.max() / 2 + 1e-6
    assert torch.equal(fake_quant_per_token(x, 16), x)


@pytest.mark.parametrize("bits", [2, 3, 4])
def test_kv_fake_quant_is_a_min_max_grid_per_vector(bits):
    x = torch.randn(3, 5, 64, generator=torch.Generator().manual_seed(6))  # 64 values per vector, ≤ 2^b levels
    kv = fake_quant_asym(x, bits)
    levels = 2 ** bits - 1
    low, high = x.amin(dim=-1, keepdim=True), x.amax(dim=-1, keepdim=True)
    step = (high - low) / levels
    for vector in kv.reshape(-1, 64):
        assert 2 <= vector.unique().numel() <= 2 ** bits
    codes = kv / step + torch.round(-low / step)  # (code − zero)·step with an integer zero point
    assert ((codes - codes.round()).abs() < 1e-3).all()
    assert codes.round().min() >= 0 and codes.round().max() <= levels
    assert ((kv - x).abs() <= step + 1e-6).all()  # within a step (the zero point's rounding shifts the grid)
    assert (kv - x).abs().mean() < step.mean() * 0.5


@pytest.mark.parametrize("spec", ["4:4", "3:2", "x:4", "2-4", "0:4"])
def test_bad_nm_specs(spec):
    with pytest.raises(BadInputError):
        parse_nm(spec)


def test_bad_sparsity():
    with pytest.raises(BadInputError):
        unstructured_mask(torch.rand(2, 4), 1.0)


def test_clip_search_is_its_definition():
    W = torch.randn(16, 96, generator=torch.Generator().manual_seed(7)) ** 3
    for bits in (3, 4):
        xmax = W.abs().amax(dim=1)
        best, best_err = xmax / (2 ** (bits - 1) - 1), torch.full((16,), float("inf"))
        for i in range(80):  # grid 100, max shrink 0.8, error norm 2.4, the first minimum wins
            scale = (1 - i / 100) * xmax / (2 ** (bits - 1) - 1)
            err = (quantize_rows(W, scale, bits) - W).abs().pow(2.4).sum(dim=1)
            best, best_err = torch.where(err < best_err, scale, best), torch.minimum(err, best_err)
        assert torch.equal(fit_weight_scale(W, bits), best)
