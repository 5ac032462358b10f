"""w_range: the unclipped weight scale as GPTQ's reference (max/(2^{b-1}-1)) or as llm-compressor's min-max observer
(max/(2^{b-1}-1/2): the most negative weight lands on code -2^{b-1}, so all 2^b codes are used)."""

import torch

from toolkit.compress.quant import codes_of, fit_grid, fit_weight_scale


def test_full_range_is_llm_compressors_min_max():
    torch.manual_seed(0)
    W = torch.randn(16, 64)
    W[0, 3] = -5.0  # row 0's largest magnitude is negative: it takes code -8
    signed = fit_weight_scale(W, 4, mse=False)
    full = fit_weight_scale(W, 4, mse=False, full_range=True)
    xmax = W.abs().amax(dim=1)
    assert torch.allclose(signed, xmax / 7) and torch.allclose(full, xmax / 7.5)
    codes = codes_of(W, full, 4)
    assert codes[0, 3].item() == -8 and codes.max().item() <= 7
    assert codes_of(W, signed, 4).min().item() >= -7  # the reference grid never reaches -8 unclipped


def test_full_range_mse_search_starts_from_its_own_base():
    torch.manual_seed(1)
    W = torch.randn(8, 128)
    full = fit_weight_scale(W, 4, full_range=True)
    assert (full <= W.abs().amax(dim=1) / 7.5 + 1e-7).all()
    grid = fit_grid(W, 4, group_size=32, full_range=True)
    assert grid.scales.shape == (8, 4)


def test_grid_defaults_follow_the_rotation():
    from toolkit.compress.config import GptqConfig
    from toolkit.compress.recipe import resolve_defaults

    unrotated = resolve_defaults(GptqConfig(model="m"), rotate=False)
    rotated = resolve_defaults(GptqConfig(model="m"), rotate=True)
    assert (unrotated.actorder, unrotated.w_clip, unrotated.w_range) == ("static", False, "full")
    assert (rotated.actorder, rotated.w_clip, rotated.w_range) == ("none", True, "signed")
    chosen = resolve_defaults(GptqConfig(model="m", w_clip=True, w_range="full", actorder="none"), rotate=False)
    assert (chosen.actorder, chosen.w_clip, chosen.w_range) == ("none", True, "full")  # what the user set stays

