"""Bit-packed ternary/binary convolution (csrc/binary) vs float conv2d and the numpy AND+popcount reference; the
ops' dispatch (one name, CPU kernel + reference + fake impl for the meta device)."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from toolkit.ops import has_op
from toolkit.segment import kernels

compiled = pytest.mark.skipif(not has_op("ternary_conv2d"), reason="toolkit._C not built with csrc/binary")

# (N, segments, O, H, W, k, stride, padding): odd channel counts, word boundaries, concatenated segments
SHAPES = [(1, [3], 5, 7, 9, 3, 1, 1), (2, [64], 64, 6, 5, 3, 2, 1), (1, [65], 70, 5, 5, 3, 1, 0),
          (2, [13, 29], 7, 8, 6, 3, 1, 2), (1, [130], 3, 4, 7, 1, 1, 0), (1, [1], 1, 3, 3, 3, 3, 1)]


def random_case(n, segments, out_ch, h, w, k, ternary, seed):
    g = torch.Generator().manual_seed(seed)
    cin = sum(segments)
    act = torch.randint(0, 2, (n, cin, h, w), generator=g).float() * 2 - 1
    if ternary:
        q = torch.randint(-1, 2, (out_ch, cin, k, k), generator=g).float()
    else:
        q = torch.randint(0, 2, (out_ch, cin, k, k), generator=g).float() * 2 - 1
    bits = kernels.pack_bool(act.permute(0, 2, 3, 1) > 0, segments)
    pos, neg = kernels.weight_planes(q, segments)
    return act, q, bits, pos, neg


def available_impls():
    impls = [0, 1]
    import toolkit._C  # noqa: F401  (registers the ops)
    for impl in (2, 3):
        try:
            torch.ops.iclrkit.ternary_conv2d(torch.zeros(1, 1, 1, 1, dtype=torch.int64),
                                             torch.zeros(1, 1, 1, 1, dtype=torch.int64),
                                             torch.zeros(1, 1, 1, 1, dtype=torch.int64), 1, 0, False, impl)
            impls.append(impl)
        except RuntimeError:
            pass
    return impls


@pytest.mark.parametrize("case", SHAPES)
@pytest.mark.parametrize("ternary", [True, False])
def test_numpy_and_popcount_matches_float_conv(case, ternary):
    n, segments, out_ch, h, w, k, stride, pad = case
    act, q, bits, pos, neg = random_case(n, segments, out_ch, h, w, k, ternary, seed=len(segments) + out_ch)
    expected = F.conv2d(act.double(), q.double(), stride=stride, padding=pad).round().int().permute(0, 2, 3, 1)
    got = kernels.ternary_conv2d_numpy(bits.numpy(), pos.numpy(), neg.numpy(), stride, pad)
    np.testing.assert_array_equal(got, expected.numpy())
    ref = kernels.ternary_conv2d_reference(bits, pos, neg, stride, pad, segments)
    assert torch.equal(ref, expected)


@compiled
@pytest.mark.parametrize("case", SHAPES)
@pytest.mark.parametrize("ternary", [True, False])
def test_compiled_conv_bit_exact_every_path(case, ternary):
    n, segments, out_ch, h, w, k, stride, pad = case
    act, q, bits, pos, neg = random_case(n, segments, out_ch, h, w, k, ternary, seed=7 * out_ch + h)
    expected = F.conv2d(act.double(), q.double(), stride=stride, padding=pad).round().int().permute(0, 2, 3, 1)
    g = torch.Generator().manual_seed(1)
    threshold = torch.randint(-9, 10, (out_ch,), generator=g)
    flip = torch.rand(out_ch, generator=g) < 0.3
    want_bits = kernels.pack_bool(kernels.threshold_bits(expected, threshold, flip))
    for impl in available_impls():
        modes = [False, True] if not ternary else [False]  # binary weights may also take the one-plane path
        for one_plane in modes:
            got = torch.ops.iclrkit.ternary_conv2d(bits, pos, neg, stride, pad, one_plane, impl)
            assert torch.equal(got, expected.contiguous()), (impl, one_plane)
            packed = torch.ops.iclrkit.ternary_conv2d_sign(bits, pos, neg, threshold, flip, stride, pad, one_plane,
                                                           impl)
            assert torch.equal(packed, want_bits), (impl, one_plane)


@compiled
def test_pack_sign_matches_reference():
    x = torch.randn(2, 70, 5, 6)
    x[0, 3, 2, 2] = 0.0  # sign(0) = +1
    assert torch.equal(torch.ops.iclrkit.pack_sign(x), kernels.pack_sign_reference(x))


def test_pack_unpack_roundtrip_with_segments():
    bits = torch.rand(2, 3, 4, 77) > 0.5
    words = kernels.pack_bool(bits, [13, 64])
    assert words.shape[-1] == 1 + 1
    assert torch.equal(kernels.unpack_bool(words, [13, 64]), bits)


def test_bit_maxpool_and_upsample_match_float_ops():
    act = torch.randint(0, 2, (2, 67, 7, 6)).float() * 2 - 1
    bits = kernels.pack_sign_reference(act)
    pooled = kernels.unpack_sign(kernels.maxpool_bits(bits), [67])
    assert torch.equal(pooled, F.max_pool2d(act, 2))
    up = kernels.unpack_sign(kernels.upsample_bits(bits), [67])
    assert torch.equal(up, F.interpolate(act, scale_factor=2, mode="nearest"))


def test_weight_planes_reject_non_ternary():
    with pytest.raises(ValueError):
        kernels.weight_planes(torch.tensor([[[[0.5]]]]))


def test_op_reference_matches_numpy_popcount():
    """The registered pure-torch reference (what runs without a device kernel) is exact, padding bits included."""
    for ternary in (True, False):
        act, q, bits, pos, neg = random_case(2, [13, 29], 7, 8, 6, 3, ternary, seed=11)
        want = kernels.ternary_conv2d_numpy(bits.numpy(), pos.numpy(), neg.numpy(), 1, 1)
        got = kernels._conv_op_reference(bits, pos, neg, 1, 1, not ternary, 0)
        assert got.dtype == torch.int32 and np.array_equal(got.numpy(), want)


def test_one_op_name_with_cpu_kernel_reference_and_fake():
    from toolkit.ops.registry import has_kernel

    for name in ("ternary_conv2d", "ternary_conv2d_sign", "pack_sign"):
        assert has_kernel(name, "Meta") and has_kernel(name, "CompositeExplicitAutograd")
        if has_op(name):
            assert has_kernel(name, "CPU")


def test_fake_impls_give_shapes_on_meta():
    x = torch.empty(2, 9, 7, 2, dtype=torch.int64, device="meta")
    pos = torch.empty(70, 3, 3, 2, dtype=torch.int64, device="meta")
    sums = kernels.ternary_conv2d(x, pos, pos, stride=2, padding=1)
    assert sums.shape == (2, 5, 4, 70) and sums.dtype == torch.int32 and sums.device.type == "meta"
    threshold = torch.empty(70, dtype=torch.int64, device="meta")
    bits = kernels.ternary_conv2d_sign(x, pos, pos, threshold, threshold.bool(), stride=1, padding=1)
    assert bits.shape == (2, 9, 7, 2) and bits.dtype == torch.int64
    packed = kernels.pack_sign(torch.empty(3, 130, 5, 6, device="meta"))
    assert packed.shape == (3, 5, 6, 3) and packed.dtype == torch.int64


def test_packed_unet_runs_on_the_meta_device():
    """No device is hard-wired: the whole packed network propagates shapes on meta tensors."""
    from toolkit.segment.mbunet import UNet
    from toolkit.segment.packed import convert

    torch.manual_seed(0)
    model = UNet(16, 2, 3, "masked").eval()
    packed = convert(model).to("meta")
    assert packed.device.type == "meta"
    logits = packed(torch.empty(1, 3, 16, 16, device="meta"))
    assert logits.shape == (1, 3, 16, 16) and logits.device.type == "meta"
