"""INT4 GEMM kernels: layouts round-trip, every compiled path is bit-exact against an independent integer brute
force, ragged shapes, 2:4 metadata, PackedInt4Linear vs fake-quant, packed-format conversion, bad input."""

import numpy as np
import pytest
import torch

from toolkit.compress.packed_int4 import codes_from_packed
from toolkit.core.errors import BadInputError
from toolkit.ops import has_op
from toolkit.ops.int4 import (
    int4_gemm,
    int4_gemm_reference,
    is_24_sparse,
    pack_24,
    pack_dense,
    padded,
    quantize_activations,
    s4_layout,
    to_kernel_layout,
    unpack_kernel_codes,
)
from toolkit.ops.packed_linear import PackedInt4Linear
from toolkit.ops.w4a16 import w4a16_gemm, w4a16_layout, w4a16_unpack

COMPILED = has_op("int4_gemm") and has_op("int4_gemm_24")
SHAPES = [(1, 1, 1), (3, 5, 7), (5, 9, 130), (7, 13, 257), (1, 4, 128), (33, 6, 384), (4, 8, 64)]


def _paths():
    if not COMPILED:
        return []
    paths = ["scalar"]
    probe = pack_dense(torch.zeros(1, 4, dtype=torch.int16), torch.ones(1))
    for path in ("avx2", "vnni"):
        try:
            int4_gemm(torch.zeros(1, 4, dtype=torch.int8), torch.ones(1), probe, path=path)
            paths.append(path)
        except RuntimeError:
            pass
    return paths


PATHS = _paths()


def random_codes(n, k, generator, sparse24=False):
    codes = torch.randint(-8, 8, (n, k), generator=generator, dtype=torch.int16)
    if sparse24:
        k4 = -(-k // 4) * 4
        full = torch.zeros(n, k4, dtype=torch.int16)
        full[:, :k] = codes
        groups = full.view(n, -1, 4)
        drop = torch.rand(groups.shape, generator=generator).argsort(-1)[..., :2]
        groups.scatter_(-1, drop, 0)
        codes = full[:, :k].clone()
    return codes


def brute_force(xq, x_scale, codes, w_scale):
    """Python-int dot products: independent of the torch reference's vectorised int64 sum."""
    m, n = xq.shape[0], codes.shape[0]
    acc = torch.zeros(m, n, dtype=torch.int32)
    for i in range(m):
        for j in range(n):
            acc[i, j] = sum(int(a) * int(b) for a, b in zip(xq[i].tolist(), codes[j].tolist()))
    return acc.float() * x_scale.unsqueeze(1) * w_scale.unsqueeze(0)


@pytest.mark.parametrize("sparse", [False, True])
def test_layout_round_trip(sparse):
    g = torch.Generator().manual_seed(0)
    for n, k in [(3, 7), (5, 130), (2, 257)]:
        codes = random_codes(n, k, g, sparse24=sparse)
        if sparse and k % 4:
            continue
        weights = (pack_24 if sparse else pack_dense)(codes, torch.ones(n))
        assert torch.equal(unpack_kernel_codes(weights), codes)
        assert torch.equal(weights.rowsum, codes.to(torch.int32).sum(1))


def test_reference_matches_brute_force():
    g = torch.Generator().manual_seed(1)
    codes = random_codes(6, 19, g)
    xq = torch.randint(-127, 128, (4, 19), generator=g, dtype=torch.int8)
    xs, ws = torch.rand(4, generator=g) + 0.1, torch.rand(6, generator=g) + 0.1
    weights = pack_dense(codes, ws)
    assert torch.equal(int4_gemm_reference(xq, xs, weights), brute_force(xq, xs, codes, ws))


@pytest.mark.skipif(not COMPILED, reason="toolkit._C without int4 ops")
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_dense_kernel_bit_exact(m, n, k):
    g = torch.Generator().manual_seed(m * 1000 + n * 10 + k)
    codes = random_codes(n, k, g)
    xq = torch.randint(-127, 128, (m, k), generator=g, dtype=torch.int8)
    xs, ws = torch.rand(m, generator=g) + 0.01, torch.rand(n, generator=g) + 0.01
    weights = pack_dense(codes, ws)
    expected = int4_gemm_reference(xq, xs, weights)
    for path in PATHS:
        assert torch.equal(int4_gemm(xq, xs, weights, path=path), expected), path


@pytest.mark.skipif(not COMPILED, reason="toolkit._C without int4 ops")
@pytest.mark.parametrize("m,n,k", [s for s in SHAPES if s[2] % 4 == 0] + [(9, 11, 516), (6, 5, 4)])
def test_sparse_kernel_bit_exact(m, n, k):
    g = torch.Generator().manual_seed(7 + m * 1000 + n * 10 + k)
    codes = random_codes(n, k, g, sparse24=True)
    xq = torch.randint(-127, 128, (m, k), generator=g, dtype=torch.int8)
    xs, ws = torch.rand(m, generator=g) + 0.01, torch.rand(n, generator=g) + 0.01
    weights = pack_24(codes, ws)
    expected = int4_gemm_reference(xq, xs, weights)
    assert torch.equal(expected, int4_gemm_reference(xq, xs, pack_dense(codes, ws)))
    for path in PATHS:
        assert torch.equal(int4_gemm(xq, xs, weights, path=path), expected), path


@pytest.mark.skipif(not COMPILED, reason="toolkit._C without int4 ops")
def test_extreme_values_do_not_saturate():
    k = 512
    codes = torch.full((4, k), -8, dtype=torch.int16)
    xq = torch.full((3, k), -127, dtype=torch.int8)
    weights = pack_dense(codes, torch.ones(4))
    for path in PATHS:
        assert torch.equal(int4_gemm(xq, torch.ones(3), weights, path=path), torch.full((3, 4), 127.0 * 8 * k))


def test_activation_quantization_bounds_and_zero_token():
    x = torch.tensor([[0.0, 0.0, 0.0], [1.0, -2.0, 0.5]])
    for bits in (8, 4):
        codes, scale = quantize_activations(x, bits)
        top = 2 ** (bits - 1) - 1
        assert codes.dtype == torch.int8 and int(codes.abs().max()) == top
        assert scale[0] == 1 and torch.all(codes[0] == 0)
        assert torch.allclose(codes[1].float() * scale[1], x[1], atol=float(scale[1]) / 2 + 1e-7)


@pytest.mark.parametrize("sparse", ["dense", "24"])
def test_packed_linear_matches_fake_quant(sparse):
    g = torch.Generator().manual_seed(3)
    codes = random_codes(24, 64, g, sparse24=True)
    scales = torch.rand(24, generator=g) * 0.1 + 0.01
    bias = torch.randn(24, generator=g)
    layer = PackedInt4Linear.from_codes(codes, scales, bias, a_bits=8, sparse=sparse)
    assert layer.weights.sparse == (sparse == "24")
    x = torch.randn(2, 5, 64, generator=g)
    xq, xs = quantize_activations(x.reshape(-1, 64), 8)
    fake = (xq.float() * xs[:, None]) @ (codes.float() * scales[:, None]).t() + bias
    assert torch.allclose(layer(x), fake.reshape(2, 5, 24), atol=1e-4, rtol=1e-5)


def test_codes_from_packed_round_trip_both_storage_forms():
    from toolkit.compress.packed import pack_linear

    g = torch.Generator().manual_seed(4)
    for sparse in (False, True):
        codes = random_codes(8, 12, g, sparse24=sparse)
        scale = torch.rand(8, generator=g) + 0.1
        stored = pack_linear(codes.float() * scale[:, None], scale, 4)
        assert ("mask" in stored) == sparse
        recovered = codes_from_packed(stored, (8, 12), 4)
        assert torch.equal(recovered, codes)
        assert to_kernel_layout(recovered, scale).sparse == sparse == is_24_sparse(recovered)


def test_bad_inputs_raise():
    dense = torch.ones(2, 8, dtype=torch.int16)
    with pytest.raises(BadInputError):
        pack_24(dense, torch.ones(2))
    with pytest.raises(BadInputError):
        pack_dense(torch.full((2, 4), 9, dtype=torch.int16), torch.ones(2))
    with pytest.raises(BadInputError):
        to_kernel_layout(dense, torch.ones(2), sparse="half")
    with pytest.raises(BadInputError):
        int4_gemm(torch.zeros(1, 5, dtype=torch.int8), torch.ones(1), pack_dense(dense, torch.ones(2)))
    with pytest.raises(BadInputError):
        quantize_activations(torch.ones(2, 2), bits=1)
    with pytest.raises(BadInputError):
        codes_from_packed({"qweight": np.zeros(4, np.uint8), "scales": np.ones(2, np.float32)}, (2, 4), 8)


# ------------------------------------------------------------------ dispatch: one op name, reference, fake (meta)
OPS = ("int4_gemm", "int4_gemm_24", "int4_gemm_s4", "w4a16_gemm")


def test_ops_have_reference_and_fake_under_one_name():
    from toolkit.ops.registry import has_kernel

    for name in OPS:
        assert has_kernel(name, "CompositeExplicitAutograd") and has_kernel(name, "Meta"), name
    if COMPILED:  # the compiled CPU kernels sit under the same names as the CUDA ones (tests/unit/test_cuda_compile.py)
        assert has_kernel("int4_gemm", "CPU") and has_kernel("int4_gemm_24", "CPU")


def test_fake_impls_give_shapes_on_meta():
    meta = torch.device("meta")
    xq, xs = torch.empty(5, 300, dtype=torch.int8, device=meta), torch.empty(5, device=meta)
    dense = pack_dense(torch.zeros(7, 300, dtype=torch.int16), torch.ones(7))
    ws = dense.scales.to(meta)
    y = torch.ops.iclrkit.int4_gemm(xq, xs, dense.packed.to(meta), ws, dense.rowsum.to(meta), 300, "auto")
    assert y.shape == (5, 7) and y.dtype == torch.float32 and y.device == meta
    sparse = pack_24(torch.zeros(7, 300, dtype=torch.int16), torch.ones(7))
    y = torch.ops.iclrkit.int4_gemm_24(xq, xs, sparse.packed.to(meta), sparse.meta.to(meta), ws,
                                       sparse.rowsum.to(meta), 300, "auto")
    assert y.shape == (5, 7) and y.dtype == torch.float32
    y = torch.ops.iclrkit.int4_gemm_s4(torch.empty(5, 32, dtype=torch.uint8, device=meta), xs,
                                       torch.empty(7, 32, dtype=torch.uint8, device=meta), ws, 64)
    assert y.shape == (5, 7)
    w16 = w4a16_layout(torch.zeros(7, 300, dtype=torch.int16), torch.ones(7))
    y = torch.ops.iclrkit.w4a16_gemm(torch.empty(5, 300, dtype=torch.float16, device=meta), w16.packed.to(meta),
                                     w16.scales.to(meta), 7, 300)
    assert y.shape == (5, 7) and y.dtype == torch.float16


@pytest.mark.parametrize("a_bits", [8, 16])
def test_packed_linear_buffers_move_once_and_run_on_meta(a_bits):
    layer = PackedInt4Linear.from_codes(torch.zeros(24, 64, dtype=torch.int16), torch.ones(24), torch.zeros(24),
                                        a_bits=a_bits)
    layer = layer.to("meta")
    assert all(b.device.type == "meta" for b in layer.buffers())
    y = layer(torch.empty(2, 3, 64, device="meta", dtype=torch.float16 if a_bits == 16 else torch.float32))
    assert y.shape == (2, 3, 24) and y.device.type == "meta"


def test_s4_reference_matches_brute_force():
    g = torch.Generator().manual_seed(9)
    x = torch.randint(-8, 8, (3, 70), generator=g, dtype=torch.int16)
    codes = random_codes(5, 70, g)
    xs, ws = torch.rand(3, generator=g) + 0.1, torch.rand(5, generator=g) + 0.1
    got = torch.ops.iclrkit.int4_gemm_s4(s4_layout(x), xs, s4_layout(codes), ws, 128)
    assert torch.equal(got, brute_force(x, xs, codes, ws))


# ------------------------------------------------------------------ W4A16 weight-only layout and reference
@pytest.mark.parametrize("n,k", [(1, 1), (16, 64), (17, 65), (40, 300), (33, 256)])
def test_w4a16_layout_round_trip(n, k):
    g = torch.Generator().manual_seed(n * 100 + k)
    codes = random_codes(n, k, g)
    weights = w4a16_layout(codes, torch.ones(n))
    assert weights.packed.dtype == torch.int32 and weights.packed.shape == (-(-n // 16), -(-k // 64), 32, 4)
    assert torch.equal(w4a16_unpack(weights.packed, n, k), codes)


def test_w4a16_fragment_positions():
    """One code at a time lands in the documented lane / word / nibble of the mma.sync m16n8k16 A fragment."""
    for row, col in [(0, 0), (9, 3), (5, 10), (15, 63), (3, 17)]:
        codes = torch.zeros(16, 64, dtype=torch.int16)
        codes[row, col] = 1  # stored as 9 (code + 8); every other nibble holds 8
        words = w4a16_layout(codes, torch.ones(16)).packed.to(torch.int64) & 0xFFFFFFFF
        g, h = row % 8, row // 8
        kt, c, t, e = col // 16, (col % 16) // 8, (col % 8) // 2, col % 2
        q = h + 2 * c
        nibble = (words[0, kt // 4, 4 * g + t, kt % 4] >> (4 * (q + 4 * e))) & 0xF
        assert int(nibble) == 9
        assert int((words != 0x88888888).sum()) == 1


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-3), (torch.float16, 1e-3), (torch.bfloat16, 2 ** -7)])
def test_w4a16_reference_matches_dequantized_matmul(dtype, tol):
    """Within 1e-3 of the largest output (bfloat16: its own output rounding, 2^-8 relative, dominates)."""
    g = torch.Generator().manual_seed(5)
    n, k, m = 48, 200, 6
    codes = random_codes(n, k, g)
    scales = torch.rand(n, generator=g) * 0.02 + 0.001
    x = torch.randn(m, k, generator=g).to(dtype)
    weights = w4a16_layout(codes, scales)
    y = w4a16_gemm(x, weights)
    want = x.float() @ (codes.float() * scales[:, None]).t()
    assert y.dtype == dtype and y.shape == (m, n)
    assert float((y.float() - want).abs().max()) <= tol * float(want.abs().max())


def test_packed_linear_w4a16_matches_dequantized_linear():
    g = torch.Generator().manual_seed(6)
    codes = random_codes(24, 64, g)
    scales = torch.rand(24, generator=g) * 0.1 + 0.01
    bias = torch.randn(24, generator=g)
    layer = PackedInt4Linear.from_codes(codes, scales, bias, a_bits=16)
    x = torch.randn(2, 5, 64, generator=g)
    want = x @ (codes.float() * scales[:, None]).t() + bias
    assert torch.allclose(layer(x), want, atol=1e-4, rtol=1e-4)
    assert "w4a16" in repr(layer)
    with pytest.raises(BadInputError):
        PackedInt4Linear(pack_dense(codes, scales), a_bits=16)


def test_without_the_extension_every_op_runs_its_reference():
    """A fresh interpreter where `toolkit._C` cannot be imported: the ops still exist (schemas + references), the
    kernels report not compiled, and results equal the brute force."""
    import os
    import subprocess
    import sys

    code = """
import sys
sys.modules["toolkit._C"] = None  # import toolkit._C now raises ImportError
import torch
from toolkit.ops import compiled_ops, has_op, load_extension
from toolkit.ops.hadamard import fwht, fwht_reference
from toolkit.ops.int4 import int4_gemm, pack_24, quantize_activations
from toolkit.ops.packed_linear import PackedInt4Linear
from toolkit.segment import kernels
assert load_extension()[0] is False and compiled_ops() == [] and not has_op("int4_gemm")
g = torch.Generator().manual_seed(0)
codes = torch.randint(-8, 8, (6, 32), generator=g, dtype=torch.int16)
codes[:, 0::4] = 0; codes[:, 1::4] = 0
xq = torch.randint(-127, 128, (3, 32), generator=g, dtype=torch.int8)
acc = (xq.long() @ codes.long().t()).float()
y = int4_gemm(xq, torch.ones(3), pack_24(codes, torch.ones(6)))
assert torch.equal(y, acc), (y, acc)
x = torch.randn(4, 64, generator=g)
assert torch.equal(fwht(x), fwht_reference(x))
layer = PackedInt4Linear.from_codes(codes, torch.ones(6), a_bits=16)
assert torch.allclose(layer(x[:, :32]), x[:, :32] @ codes.float().t(), atol=1e-4)
bits = kernels.pack_sign(torch.randn(1, 3, 5, 5, generator=g))
pos, neg = kernels.weight_planes(torch.randint(-1, 2, (2, 3, 3, 3), generator=g).float())
assert kernels.ternary_conv2d(bits, pos, neg, 1, 1).shape == (1, 5, 5, 2)
print("ok")
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]


def test_cuda_w4a8_kernels_address_the_cpu_layout():
    """The byte / nibble arithmetic of csrc/int4/int4_gemm_cuda.cu, replayed in numpy: for every 32-column step and
    lane (g, t), the four codes each A-fragment register widens are the columns the m16n8k32 (.sp) map assigns it
    (dense: a0 cols 4t..4t+3, a2 cols 16+4t..; 2:4: a0 kept 4t..4t+3 of the step's 16 kept values)."""
    g_ = torch.Generator().manual_seed(21)
    n, k = 16, 384
    codes = random_codes(n, k, g_, sparse24=True)
    dense = pack_dense(codes, torch.ones(n)).packed.numpy()
    sparse = pack_24(codes, torch.ones(n))
    values, meta = sparse.packed.numpy(), sparse.meta.numpy()
    kp = padded(k)

    def widen(row_bytes, byte, high):
        raw = row_bytes[byte:byte + 4]
        return [int((b >> 4 if high else b) & 0x0F) - 8 for b in raw]

    kept = unpack_kernel_codes(sparse).numpy().reshape(n, -1, 4)
    order = np.argsort(kept == 0, axis=-1, kind="stable")[..., :2]
    kept_values = np.take_along_axis(kept, np.sort(order, axis=-1), axis=-1).reshape(n, -1)  # [n, kp/2]
    full = np.zeros((n, kp), dtype=np.int64)
    full[:, :k] = codes.numpy()
    for k0 in range(0, kp, 32):
        block, within = k0 // 128, k0 % 128
        high, byte = within >= 64, block * 64 + (within & 63)
        for lane in range(32):
            g, t = lane >> 2, lane & 3
            for row in (g, g + 8):
                assert widen(dense[row], byte + 4 * t, high) == list(full[row, k0 + 4 * t:k0 + 4 * t + 4])
                assert widen(dense[row], byte + 16 + 4 * t, high) == list(full[row, k0 + 16 + 4 * t:k0 + 20 + 4 * t])
                first = k0 // 2 + 4 * t
                sblock, j = first // 64, first % 64
                got = widen(values[row], sblock * 32 + (j & 31), j >= 32)
                assert got == list(kept_values[row, first:first + 4])
                # metadata: 16 bits = kept first..first+7 of this lane's half (tt = t & 1)
                first_meta = k0 // 2 + 8 * (t & 1)
                bits = int(meta[row, first_meta // 4]) | int(meta[row, first_meta // 4 + 1]) << 8
                for i in range(8):
                    group = (first_meta + i) // 2
                    column = group * 4 + ((bits >> (2 * i)) & 3)
                    value = kept_values[row, first_meta + i]
                    assert column >= k or full[row, column] == value or value == 0
