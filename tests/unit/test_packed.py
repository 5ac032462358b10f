"""Packed INT4 + bitmask export: bit-exact round trip and a runnable reloaded model."""

import numpy as np
import pytest
import torch

from toolkit.compress.packed import (
    load_packed,
    pack_codes,
    pack_linear,
    save_packed,
    unpack_codes,
    unpack_linear,
)
from toolkit.compress.quant import fit_weight_scale, quantize_rows
from toolkit.models.view import view_of


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_codes_round_trip(bits):
    codes = np.random.default_rng(0).integers(-(2 ** (bits - 1)), 2 ** (bits - 1), size=101).astype(np.int16)
    assert np.array_equal(unpack_codes(pack_codes(codes, bits), codes.size, bits), codes)


@pytest.mark.parametrize("sparsity", [0.0, 0.5])
def test_linear_round_trip_is_bit_exact(sparsity):
    W = torch.randn(64, 256, generator=torch.Generator().manual_seed(1))
    scale = fit_weight_scale(W, 4)
    keep = W.abs() > W.abs().quantile(sparsity) if sparsity else torch.ones_like(W, dtype=torch.bool)
    Q = quantize_rows(W * keep, scale, 4)
    tensors = pack_linear(Q, scale, 4)
    assert ("mask" in tensors) == (sparsity > 0)
    assert torch.equal(unpack_linear(tensors, Q.shape, 4), Q)
    stored = sum(v.nbytes for v in tensors.values())
    assert stored < 0.3 * Q.numel() * 2  # vs FP16


def _compress_in_place(view, bits=4):
    scales = {}
    for i, block in enumerate(view.blocks):
        for slot in view.slots(i):
            W = slot.weight(block)
            scale = fit_weight_scale(W, bits)
            keep = W.abs() >= W.abs().median(dim=1, keepdim=True).values
            slot.set_weight(block, quantize_rows(W * keep, scale, bits))
            scales[view.full_name(i, slot)] = scale
    return scales


@pytest.mark.parametrize("fixture,rotate", [("tiny_llama_dir", True), ("tiny_gpt2_dir", False)])
def test_packed_model_reloads_bit_exact(request, tmp_path, fixture, rotate):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(request.getfixturevalue(fixture)).eval()
    view = view_of(model)
    rotation = None
    if rotate:
        from toolkit.compress.rotation import rotate_model

        rotation = rotate_model(view, seed=1)
    scales = _compress_in_place(view)
    sizes = save_packed(view, None, tmp_path / "packed", scales, 4, {"rotation": rotation})
    assert sizes["packed_linear_ratio_vs_fp16"] < 0.3  # tiny layers: per-row scales weigh in
    loaded, _ = load_packed(tmp_path / "packed", with_tokenizer=False)
    for path in scales:
        assert torch.equal(loaded.get_submodule(path).weight, model.get_submodule(path).weight)
    ids = torch.randint(0, model.config.vocab_size, (1, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        diff = (loaded(ids).logits - model(ids).logits).abs().max()
    assert diff < 5e-2  # non-linear tensors are stored as float16


@pytest.mark.parametrize("bits,group", [(8, 64), (4, 16), (4, 7)])
def test_grouped_quantization_matches_per_group_rounding(bits, group):
    from toolkit.compress.packed import dequantize_groups, quantize_groups

    W = torch.randn(5, 30, generator=torch.Generator().manual_seed(2))
    codes, scales = quantize_groups(W, bits, group)
    assert scales.shape == (5, -(-30 // group)) and scales.dtype == torch.float16
    restored = dequantize_groups(codes, scales, group)
    for row in range(5):
        for g in range(scales.shape[1]):
            piece = slice(g * group, (g + 1) * group)
            step = scales[row, g].float()
            expected = torch.round(W[row, piece] / step).clamp(-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) * step
            assert torch.equal(restored[row, piece], expected)
    assert (restored - W).abs().max() < W.abs().max() / 2 ** (bits - 2)


@pytest.mark.parametrize("fixture,bits", [("tiny_llama_dir", 4), ("tiny_gpt2_dir", 8)])
def test_grouped_vocab_matrices_reload_exactly_and_shrink_the_file(request, tmp_path, fixture, bits):
    from transformers import AutoModelForCausalLM

    from toolkit.compress.packed import round_vocab_matrices, vocab_matrix_names

    model = AutoModelForCausalLM.from_pretrained(request.getfixturevalue(fixture)).eval()
    view = view_of(model)
    scales = _compress_in_place(view)
    wide = save_packed(view, None, tmp_path / "fp16", scales, 4, {})
    grids = round_vocab_matrices(view, bits, 32)
    narrow = save_packed(view, None, tmp_path / "narrow", scales, 4, {}, bits, 32, grids)
    assert narrow["packed_mb"] < wide["packed_mb"]
    loaded, _ = load_packed(tmp_path / "narrow", with_tokenizer=False)
    loaded_params, params = dict(loaded.named_parameters()), dict(model.named_parameters())
    for name in vocab_matrix_names(view):
        assert torch.equal(loaded_params[name], params[name])
