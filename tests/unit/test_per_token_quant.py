"""One per-token activation quantizer: compress's fake quantization is the INT4/INT8 kernels' quantizer
(toolkit.ops.int4.per_token_codes) dequantized, codes in ±(2^{b−1}−1); at the default clip ratio 1.0 it equals, bit
for bit, the [−2^{b−1}, 2^{b−1}−1] formula compress used before (that range's extra code was never reached)."""

from __future__ import annotations

import pytest
import torch

from toolkit.compress.quant import fake_quant_per_token
from toolkit.ops.int4 import per_token_codes, quantize_activations


def _x(dtype=torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 9, 64, generator=g) * torch.logspace(-3, 2, 9)[None, :, None]
    x[0, 0] = 0.0  # an all-zero token
    x[1, 1, 5] = -50.0  # an outlier
    return x.to(dtype)


def _old_fake(x, bits, clip_ratio=1.0):  # compress.quant before the unification
    top = 2 ** (bits - 1) - 1
    scale = (x.abs().amax(dim=-1, keepdim=True) * clip_ratio / top).clamp(min=1e-8)
    return torch.clamp(torch.round(x / scale), -top - 1, top) * scale


def _old_kernel(x, bits):  # ops.int4.quantize_activations before the unification
    top = 2 ** (bits - 1) - 1
    x = x.float()
    amax = x.abs().amax(dim=-1)
    scale = torch.where(amax > 0, amax / top, torch.ones_like(amax))
    return torch.clamp(torch.round(x / scale.unsqueeze(-1)), -top, top).to(torch.int8), scale


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_fake_quant_at_clip_one_is_unchanged_bit_for_bit(bits, dtype):
    x = _x(dtype)
    new, old = fake_quant_per_token(x, bits), _old_fake(x, bits)
    assert new.dtype == dtype
    if dtype == torch.float16:  # the old floor 1e-8 is 0 in float16: an all-zero token came out NaN (0/0)
        assert torch.isnan(old[0, 0]).all() and torch.equal(new[0, 0], x[0, 0])
        new, old = new[1:], old[1:]
    if not (dtype == torch.bfloat16 and bits == 8):
        assert torch.equal(new, old)
        return
    # bfloat16 at 8 bits: x/s of a token's largest entry can round to ±128 (bf16's step at 127 is 0.5); the old
    # range kept −128, the kernels' range saturates at −127. Only those entries differ, by one step.
    scale = (x.abs().amax(dim=-1, keepdim=True) / 127).to(dtype)
    differ = new != old
    assert torch.all(torch.round(old / scale)[differ] == -128) and torch.equal(new[~differ], old[~differ])
    codes, _ = per_token_codes(x, bits)
    assert differ.any() and torch.all(codes[differ] == -127)


@pytest.mark.parametrize("bits", [4, 8])
def test_kernel_codes_are_unchanged_and_fake_quant_is_their_dequantization(bits):
    x = _x()
    codes, scale = quantize_activations(x, bits)
    old_codes, old_scale = _old_kernel(x, bits)
    assert torch.equal(codes, old_codes) and torch.equal(scale, old_scale)
    assert torch.equal(fake_quant_per_token(x, bits), codes.float() * scale.unsqueeze(-1))


@pytest.mark.parametrize("bits", [3, 4, 8])
def test_one_integer_range_even_with_clipping(bits):
    """With clip < 1 the old fake quantizer also used code −2^{b−1}, which the kernels cannot take; now both sides
    saturate at ±(2^{b−1}−1), and the codes still equal round(x/s) wherever they are not clipped."""
    top = 2 ** (bits - 1) - 1
    x = _x()
    codes, scale = per_token_codes(x, bits, clip_ratio=0.8)
    assert int(codes.min()) == -top and int(codes.max()) == top
    raw = torch.round(x / scale)
    inside = raw.abs() <= top
    assert torch.equal(codes[inside], raw[inside]) and torch.equal(codes[~inside], raw[~inside].sign() * top)
    amax = x.abs().amax(-1, keepdim=True)
    assert torch.equal(scale, torch.where(amax > 0, amax * 0.8 / top, torch.ones_like(amax)))
    assert scale.shape == (*x.shape[:-1], 1) and torch.all(scale[0, 0] == 1)
    assert _old_fake(x, bits, 0.8).div(scale).round().min() == -top - 1  # the range the old formula reached
    assert torch.equal(fake_quant_per_token(x, bits, 0.8), codes * scale)
