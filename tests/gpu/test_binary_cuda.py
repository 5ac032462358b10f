"""CUDA binary Tensor Core kernel (csrc/binary/ternary_conv_cuda.cu), dispatched under the CPU op's name, bit-exact
vs the float reference, on weights prepacked once on the GPU (`ternary_prepack`); the packed MBU-Net on CUDA
reproduces the CPU network's logits. tests/gpu/conftest.py fails these where CUDA is present but toolkit._C lacks its
CUDA kernels."""

import pytest
import torch
import torch.nn.functional as F

from toolkit.segment import kernels, prepack


@pytest.mark.parametrize("n, cin, out_ch, h, w, stride, pad", [(1, 3, 5, 7, 9, 1, 1), (3, 130, 70, 9, 8, 2, 1),
                                                                 (2, 64, 33, 6, 6, 1, 0), (8, 128, 128, 32, 32, 1, 1)])
@pytest.mark.parametrize("ternary", [True, False])
def test_cuda_sums_and_bits_match_reference(n, cin, out_ch, h, w, stride, pad, ternary):
    g = torch.Generator().manual_seed(cin + out_ch)
    act = torch.randint(0, 2, (n, cin, h, w), generator=g).float() * 2 - 1
    low = -1 if ternary else 0
    q = torch.randint(low, 2, (out_ch, cin, 3, 3), generator=g).float()
    q = q if ternary else q * 2 - 1
    bits = kernels.pack_sign_reference(act)
    pos, neg = kernels.weight_planes(q)
    expected = F.conv2d(act.double(), q.double(), stride=stride, padding=pad).round().int().permute(0, 2, 3, 1)
    got = torch.ops.iclrkit.ternary_conv2d(bits.cuda(), pos.cuda(), neg.cuda(), stride, pad, not ternary, 0)
    assert torch.equal(got.cpu(), expected.contiguous())
    threshold = torch.randint(-20, 21, (out_ch,), generator=g)
    flip = torch.rand(out_ch, generator=g) < 0.5
    packed = torch.ops.iclrkit.ternary_conv2d_sign(bits.cuda(), pos.cuda(), neg.cuda(), threshold.cuda(),
                                                   flip.cuda(), stride, pad, not ternary, 0)
    assert torch.equal(packed.cpu(), kernels.pack_bool(kernels.threshold_bits(expected, threshold, flip)))


@pytest.mark.parametrize("n, cin, out_ch, h, w, stride, pad", [(1, 3, 5, 7, 9, 1, 1), (3, 130, 70, 9, 8, 2, 1),
                                                                 (2, 64, 33, 6, 6, 1, 0)])
@pytest.mark.parametrize("ternary", [True, False])
def test_cuda_prepack_once_then_many_calls_match_reference(n, cin, out_ch, h, w, stride, pad, ternary):
    """The CUDA prepack builds the BMMA layout once on the GPU (shapes as its fake says; it decodes back to the
    planes); the prepacked kernels then read it unchanged, call after call, bit-exact vs float conv2d."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    g = torch.Generator().manual_seed(3 * cin + out_ch)
    act = torch.randint(0, 2, (n, cin, h, w), generator=g).float() * 2 - 1
    q = torch.randint(-1 if ternary else 0, 2, (out_ch, cin, 3, 3), generator=g).float()
    q = q if ternary else q * 2 - 1
    pos, neg = kernels.weight_planes(q)
    threshold = torch.randint(-20, 21, (out_ch,), generator=g)
    flip = torch.rand(out_ch, generator=g) < 0.5
    sums = F.conv2d(act.double(), q.double(), stride=stride, padding=pad).round().int().permute(0, 2, 3, 1)
    want_bits = kernels.pack_bool(kernels.threshold_bits(sums, threshold, flip))
    weights = prepack.ternary_prepack(pos.cuda(), neg.cuda(), threshold.cuda(), flip.cuda())
    assert weights.pos.is_cuda and weights.pos.dtype == torch.int32 and weights.pos.dim() == 5
    back = weights.planes()
    assert all(torch.equal(a.cpu(), b) for a, b in zip(back, (pos, neg, threshold, flip)))
    with FakeTensorMode() as mode:
        fake = prepack.ternary_prepack(*(mode.from_tensor(t.cuda()) for t in (pos, neg, threshold, flip)))
    for name in ("pos", "neg", "tap_c", "threshold", "flip"):
        real_t, fake_t = getattr(weights, name), getattr(fake, name)
        assert real_t.shape == fake_t.shape and real_t.dtype == fake_t.dtype, name
    before = [t.clone() for t in (weights.pos, weights.neg, weights.tap_c)]
    bits = kernels.pack_sign_reference(act).cuda()
    for _ in range(3):
        got = prepack.ternary_conv2d_prepacked(bits, weights, stride, pad, not ternary)
        assert torch.equal(got.cpu(), sums.contiguous())
        packed = prepack.ternary_conv2d_sign_prepacked(bits, weights, stride, pad, not ternary)
        assert torch.equal(packed.cpu(), want_bits)
    assert all(torch.equal(a, b) for a, b in zip(before, (weights.pos, weights.neg, weights.tap_c)))


def test_packed_mbunet_on_cuda_matches_cpu():
    from toolkit.segment.mbunet import UNet
    from toolkit.segment.packed import convert

    torch.manual_seed(0)
    model = UNet(32, 2, 4, "masked").eval()
    images = torch.randn(2, 3, 32, 32)
    cpu = convert(model)
    want = cpu(images)
    gpu = convert(model).to("cuda")
    record = {}
    got = gpu(images.cuda())
    gpu.features(images.cuda(), record)
    assert all(bits.is_cuda for bits in record.values())
    assert all(layer.prepacked.pos.is_cuda and layer.prepacked.pos.dtype == torch.int32  # the CUDA layout, at .to
               for layer in gpu.layers.values())
    assert torch.allclose(got.cpu(), want, atol=1e-5)
