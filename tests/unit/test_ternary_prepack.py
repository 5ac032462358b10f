"""Prepacked ternary/binary conv weights (issue 24: weights laid out for the device once, at load, never per call):
`ternary_prepack` (one op: CPU kernel, pure-torch reference, fake) builds the kernel layout once; the prepacked conv
ops read it as it is. Checked against float conv2d of the unpacked operands, the compiled prepack against the
reference prepack bit for bit, shapes on the meta device / under FakeTensorMode, and the packed MBU-Net's calls
recorded at the dispatcher: no prepack and no raw-plane op per call."""

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from toolkit.ops import has_op
from toolkit.ops.registry import has_kernel
from toolkit.segment import kernels, prepack

compiled = pytest.mark.skipif(not has_op("ternary_prepack"), reason="toolkit._C not built with csrc/binary")

# (N, segments, O, H, W, k, stride, padding): odd channel counts, word boundaries (O = 64, 70), concatenated segments
SHAPES = [(1, [3], 5, 7, 9, 3, 1, 1), (2, [64], 64, 6, 5, 3, 2, 1), (1, [65], 70, 5, 5, 3, 1, 0),
          (2, [13, 29], 7, 8, 6, 3, 1, 2), (1, [130], 3, 4, 7, 1, 1, 0)]


def _case(n, segments, out_ch, h, w, k, ternary, seed):
    g = torch.Generator().manual_seed(seed)
    cin = sum(segments)
    act = torch.randint(0, 2, (n, cin, h, w), generator=g).float() * 2 - 1
    q = torch.randint(-1 if ternary else 0, 2, (out_ch, cin, k, k), generator=g).float()
    q = q if ternary else q * 2 - 1
    bits = kernels.pack_bool(act.permute(0, 2, 3, 1) > 0, segments)
    pos, neg = kernels.weight_planes(q, segments)
    threshold = torch.randint(-9, 10, (out_ch,), generator=g)
    flip = torch.rand(out_ch, generator=g) < 0.3
    return act, q, bits, pos, neg, threshold, flip


def _expected(act, q, stride, pad, threshold, flip):
    sums = F.conv2d(act.double(), q.double(), stride=stride, padding=pad).round().int().permute(0, 2, 3, 1)
    return sums.contiguous(), kernels.pack_bool(kernels.threshold_bits(sums, threshold, flip))


def _impls():
    impls = [0, 1]
    probe = prepack.ternary_prepack(torch.zeros(1, 1, 1, 1, dtype=torch.int64), torch.zeros(1, 1, 1, 1,
                                                                                           dtype=torch.int64))
    for impl in (2, 3):
        try:
            prepack.ternary_conv2d_prepacked(torch.zeros(1, 1, 1, 1, dtype=torch.int64), probe, impl=impl)
            impls.append(impl)
        except RuntimeError:
            pass
    return impls


@compiled
@pytest.mark.parametrize("case", SHAPES)
def test_compiled_prepack_is_the_reference_layout_bit_for_bit(case):
    n, segments, out_ch, h, w, k, stride, pad = case
    _, _, _, pos, neg, threshold, flip = _case(n, segments, out_ch, h, w, k, True, seed=out_ch)
    got = torch.ops.iclrkit.ternary_prepack(pos, neg, threshold, flip)
    want = prepack._prepack_reference(pos, neg, threshold, flip)
    assert len(got) == len(want) == 5
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    o_pad = -(-out_ch // 8) * 8
    assert got[0].shape == (k, k, pos.shape[-1], o_pad) and got[4].shape == (o_pad // 8,)
    assert bool((got[3][out_ch:] == prepack.INT64_MAX).all())  # padding channels can never fire


@pytest.mark.parametrize("case", SHAPES)
def test_prepack_roundtrips_to_the_planes(case):
    n, segments, out_ch, h, w, k, stride, pad = case
    _, _, _, pos, neg, threshold, flip = _case(n, segments, out_ch, h, w, k, True, seed=3 * out_ch)
    pos_back, neg_back, thr_back, flip_back = prepack.ternary_prepack(pos, neg, threshold, flip).planes()
    assert torch.equal(pos_back, pos) and torch.equal(neg_back, neg)
    assert torch.equal(thr_back, threshold) and torch.equal(flip_back, flip)


@compiled
@pytest.mark.parametrize("case", SHAPES)
@pytest.mark.parametrize("ternary", [True, False])
def test_prepack_once_then_many_calls_equal_the_reference(case, ternary):
    n, segments, out_ch, h, w, k, stride, pad = case
    act, q, bits, pos, neg, threshold, flip = _case(n, segments, out_ch, h, w, k, ternary, seed=7 * out_ch + h)
    want_sums, want_bits = _expected(act, q, stride, pad, threshold, flip)
    weights = prepack.ternary_prepack(pos, neg, threshold, flip)
    before = [t.clone() for t in (weights.pos, weights.neg, weights.tap_c, weights.threshold, weights.flip)]
    for impl in _impls():
        for one_plane in ([False] if ternary else [False, True]):
            for _ in range(3):
                sums = prepack.ternary_conv2d_prepacked(bits, weights, stride, pad, one_plane, impl)
                assert torch.equal(sums, want_sums), (impl, one_plane)
                packed = prepack.ternary_conv2d_sign_prepacked(bits, weights, stride, pad, one_plane, impl)
                assert torch.equal(packed, want_bits), (impl, one_plane)
    after = (weights.pos, weights.neg, weights.tap_c, weights.threshold, weights.flip)
    assert all(torch.equal(a, b) for a, b in zip(before, after))  # the calls read the layout, never rewrite it
    # the one-shot raw-plane ops give the same results
    assert torch.equal(kernels.ternary_conv2d(bits, pos, neg, stride, pad), want_sums)
    assert torch.equal(kernels.ternary_conv2d_sign(bits, pos, neg, threshold, flip, stride, pad), want_bits)


@pytest.mark.parametrize("ternary", [True, False])
def test_reference_prepack_and_prepacked_reference_ops_are_exact(ternary):
    """What runs on a device without a compiled kernel (and without toolkit._C): the pure-torch prepack and convs."""
    for case in SHAPES:
        n, segments, out_ch, h, w, k, stride, pad = case
        act, q, bits, pos, neg, threshold, flip = _case(n, segments, out_ch, h, w, k, ternary, seed=out_ch + 1)
        want_sums, want_bits = _expected(act, q, stride, pad, threshold, flip)
        laid = prepack._prepack_reference(pos, neg, threshold, flip)
        p, nq, tap_c, thr, flp = laid
        got = prepack._prepacked_op_reference(bits, p, nq, tap_c, out_ch, stride, pad, not ternary, 0)
        assert got.dtype == torch.int32 and torch.equal(got, want_sums)
        got_bits = prepack._prepacked_sign_op_reference(bits, p, nq, tap_c, thr, flp, out_ch, stride, pad,
                                                        not ternary, 0)
        assert torch.equal(got_bits, want_bits)
        # the tap constants: popc(pos) - popc(neg) of each tap, straight from the float weights
        dense = q.sum(1).permute(1, 2, 0)  # [kh, kw, O]
        assert torch.equal(tap_c[..., :out_ch], dense.to(torch.int64))


def _bmma_layout(planes: torch.Tensor, o_pad: int) -> torch.Tensor:
    """The CUDA prepack's documented plane layout, built here independently: int32 [kh, kw, KC, O_pad, 4], the
    channel's int64 words padded to whole 128-bit chunks (little-endian halves), zero padding channels."""
    out_ch, kh, kw, words = planes.shape
    even = F.pad(planes, (0, words % 2))
    u32 = even.contiguous().view(torch.int32).reshape(out_ch, kh, kw, -1, 4)
    return F.pad(u32.permute(1, 2, 3, 0, 4), (0, 0, 0, o_pad - out_ch)).contiguous()


@pytest.mark.parametrize("case", SHAPES)
def test_reference_reads_the_cuda_layout(case):
    """The pure-torch decode of the CUDA layout (used by tests/gpu and by the reference) inverts it exactly, and the
    reference conv on that layout is exact: the CUDA prepack's contract, checked without a GPU."""
    n, segments, out_ch, h, w, k, stride, pad = case
    act, q, bits, pos, neg, threshold, flip = _case(n, segments, out_ch, h, w, k, True, seed=out_ch + 5)
    o_pad = -(-out_ch // prepack.CUDA_CHANNELS) * prepack.CUDA_CHANNELS
    p, nq = _bmma_layout(pos, o_pad), _bmma_layout(neg, o_pad)
    tap_c = F.pad(q.sum(1).permute(1, 2, 0), (0, o_pad - out_ch)).to(torch.int32)
    weights = prepack.PrepackedWeights(p, nq, tap_c, threshold, flip, out_ch, pos.shape[-1])
    back = weights.planes()
    assert all(torch.equal(a, b) for a, b in zip(back, (pos, neg, threshold, flip)))
    want_sums, want_bits = _expected(act, q, stride, pad, threshold, flip)
    assert torch.equal(prepack._prepacked_op_reference(bits, p, nq, tap_c, out_ch, stride, pad, False, 0), want_sums)
    assert torch.equal(prepack._prepacked_sign_op_reference(bits, p, nq, tap_c, threshold, flip, out_ch, stride, pad,
                                                            False, 0), want_bits)


def test_new_ops_have_one_name_with_cpu_kernel_reference_and_fake():
    for name in ("ternary_prepack", "ternary_conv2d_prepacked", "ternary_conv2d_sign_prepacked"):
        assert has_kernel(name, "Meta") and has_kernel(name, "CompositeExplicitAutograd"), name
        if has_op("ternary_conv2d"):
            assert has_kernel(name, "CPU"), name


def test_prepacked_op_signatures_take_the_layout_not_the_planes():
    """The per-call ops take the prepack's tensors (tap constants, channel count), so no call can re-lay planes."""
    for name in ("ternary_conv2d_prepacked", "ternary_conv2d_sign_prepacked"):
        args = [a.name for a in getattr(torch.ops.iclrkit, name).default._schema.arguments]
        assert args[:4] == ["x", "w_pos", "w_neg", "tap_c"] and "out_channels" in args, (name, args)
    outs = torch.ops.iclrkit.ternary_prepack.default._schema.returns
    assert len(outs) == 5


@compiled
def test_compiled_prepacked_ops_reject_raw_planes():
    """A wrong layout fails loudly instead of being re-laid behind the caller's back."""
    _, _, bits, pos, neg, threshold, flip = _case(1, [3], 5, 7, 9, 3, True, seed=0)
    tap_c = torch.zeros(3, 3, 8, dtype=torch.int64)
    with pytest.raises(RuntimeError, match="ternary_prepack"):
        torch.ops.iclrkit.ternary_conv2d_prepacked(bits, pos, neg, tap_c, 5, 1, 1, False, 0)
    weights = prepack.ternary_prepack(pos, neg, threshold, flip)
    with pytest.raises(RuntimeError, match="ternary_prepack"):
        torch.ops.iclrkit.ternary_conv2d_sign_prepacked(bits, weights.pos, weights.neg, weights.tap_c, threshold,
                                                        flip, 5, 1, 1, False, 0)


def test_fake_impls_propagate_shapes_on_meta():
    pos = torch.empty(70, 3, 3, 2, dtype=torch.int64, device="meta")
    threshold = torch.empty(70, dtype=torch.int64, device="meta")
    weights = prepack.ternary_prepack(pos, pos, threshold, threshold.bool())
    assert weights.pos.device.type == "meta"
    assert weights.pos.shape == (3, 3, 2, 72) and weights.pos.dtype == torch.int64
    assert weights.tap_c.shape == (3, 3, 72) and weights.threshold.shape == (72,)
    assert weights.flip.shape == (9,) and weights.flip.dtype == torch.uint8
    x = torch.empty(2, 9, 7, 2, dtype=torch.int64, device="meta")
    sums = prepack.ternary_conv2d_prepacked(x, weights, stride=2, padding=1)
    assert sums.shape == (2, 5, 4, 70) and sums.dtype == torch.int32 and sums.device.type == "meta"
    bits = prepack.ternary_conv2d_sign_prepacked(x, weights, stride=1, padding=1)
    assert bits.shape == (2, 9, 7, 2) and bits.dtype == torch.int64 and bits.device.type == "meta"


def test_fake_shapes_match_the_real_ops_under_fake_tensor_mode():
    """What torch.compile traces with: the fakes' shapes and dtypes are the CPU ops' real ones."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    _, _, bits, pos, neg, threshold, flip = _case(2, [13, 29], 7, 8, 6, 3, True, seed=5)
    real = prepack.ternary_prepack(pos, neg, threshold, flip)
    real_out = (prepack.ternary_conv2d_prepacked(bits, real, 2, 1), prepack.ternary_conv2d_sign_prepacked(bits, real))
    with FakeTensorMode() as mode:
        fake = prepack.ternary_prepack(*(mode.from_tensor(t) for t in (pos, neg, threshold, flip)))
        fx = mode.from_tensor(bits)
        fake_out = (prepack.ternary_conv2d_prepacked(fx, fake, 2, 1), prepack.ternary_conv2d_sign_prepacked(fx, fake))
    for name in ("pos", "neg", "tap_c", "threshold", "flip"):
        a, b = getattr(real, name), getattr(fake, name)
        assert a.shape == b.shape and a.dtype == b.dtype, name
    for a, b in zip(real_out, fake_out):
        assert a.shape == b.shape and a.dtype == b.dtype


class _OpLog(TorchDispatchMode):
    """Every op the dispatcher runs inside the block, by name (iclrkit::ternary_prepack, ...)."""

    def __init__(self):
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func._schema.name)
        return func(*args, **(kwargs or {}))

    def count(self, name: str) -> int:
        return self.names.count(f"iclrkit::{name}")


RAW_OPS = ("ternary_prepack", "ternary_conv2d", "ternary_conv2d_sign")


@pytest.mark.parametrize("shortcut", [False, True])
def test_packed_unet_prepacks_at_construction_and_never_per_call(shortcut):
    from toolkit.segment.mbunet import UNet
    from toolkit.segment.packed import convert

    torch.manual_seed(0)
    model = UNet(8, 2, 3, "masked", shortcut=shortcut).eval()
    model.set_mask_ratios({"enc.0.0": 0.5, "fuse.1": 0.3})
    images = torch.randn(2, 3, 16, 16)
    with _OpLog() as load:
        packed = convert(model)
    assert load.count("ternary_prepack") == len(packed.layers)
    want = model(images)
    with _OpLog() as calls:
        for _ in range(3):
            got = packed(images)
    assert torch.equal(got, want)
    assert all(calls.count(name) == 0 for name in RAW_OPS), [n for n in calls.names if "ternary" in n]
    per_call = "ternary_conv2d_prepacked" if shortcut else "ternary_conv2d_sign_prepacked"
    assert calls.count(per_call) == 3 * len(packed.layers)


def test_layer_to_prepacks_once_per_device_move():
    from toolkit.segment.mbunet import UNet
    from toolkit.segment.packed import convert

    torch.manual_seed(1)
    packed = convert(UNet(8, 1, 3, "masked").eval())
    layer = next(iter(packed.layers.values()))
    with _OpLog() as log:
        same = layer.to("cpu")
    assert same is layer and log.count("ternary_prepack") == 0  # already there: nothing re-laid
    with _OpLog() as log:
        moved = layer.to("meta")
    assert log.count("ternary_prepack") == 1 and moved.prepacked.pos.device.type == "meta"


def test_load_packed_on_a_device_prepacks_there(tmp_path):
    from toolkit.segment.mbunet import UNet
    from toolkit.segment.packed import convert, load_packed, save_packed

    torch.manual_seed(2)
    model = UNet(8, 1, 3, "masked").eval()
    model.set_mask_ratios({"enc.0.0": 0.5})
    save_packed(convert(model), tmp_path)
    images = torch.randn(1, 3, 8, 8)
    cpu, _ = load_packed(tmp_path, device="cpu")
    assert torch.equal(cpu(images), model(images))
    with _OpLog() as log:
        meta, _ = load_packed(tmp_path, device="meta")
    assert log.count("ternary_prepack") == len(meta.layers)  # once per layer, on the target device only
    assert all(layer.prepacked.pos.device.type == "meta" for layer in meta.layers.values())
    assert meta(torch.empty(1, 3, 8, 8, device="meta")).shape == (1, 3, 8, 8)


def test_without_the_extension_the_packed_unet_runs_prepacked_references():
    """A fresh interpreter where `toolkit._C` cannot be imported: the prepack/prepacked ops exist (schemas defined
    in Python), run their references, and the packed network still equals the float model bit for bit."""
    import os
    import subprocess
    import sys

    code = """
import sys
sys.modules["toolkit._C"] = None
import torch
from toolkit.ops import has_op
from toolkit.segment.mbunet import UNet
from toolkit.segment.packed import convert
assert not has_op("ternary_prepack")
torch.manual_seed(0)
model = UNet(8, 1, 3, "masked").eval()
model.set_mask_ratios({"enc.0.0": 0.5})
packed = convert(model)
layer = packed.layers["enc.0.0"]
assert layer.prepacked.pos.shape == (3, 3, 1, 8) and layer.prepacked.flip.dtype == torch.uint8
images = torch.randn(2, 3, 8, 8)
assert torch.equal(packed(images), model(images))
print("ok")
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "OMP_NUM_THREADS": "1"}, cwd=os.path.dirname(os.path.dirname(
                                os.path.dirname(os.path.abspath(__file__)))))
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]
