"""The INT4 CUDA kernels, dispatched under the CPU ops' names, against the integer references: W4A8 / W4A4 dense
(s8 MMA), 2:4 (mma.sp), s4 dense (W4A4), bit-exact; W4A16 weight-only (FP16/BF16 MMA) within 1e-3 of the largest
output (bf16: its output rounding, 2^-7); PackedInt4Linear on CUDA vs CPU."""

import pytest
import torch

from toolkit.ops.int4 import (
    int4_gemm,
    int4_gemm_reference,
    pack_24,
    pack_dense,
    quantize_activations,
    s4_layout,
)
from toolkit.ops.packed_linear import PackedInt4Linear
from toolkit.ops.w4a16 import w4a16_gemm, w4a16_layout

SHAPES = [(1, 8, 64), (1, 16, 128), (16, 8, 64), (5, 13, 100), (33, 40, 320), (9, 11, 516), (64, 256, 4096)]


def random_24(n, k, g):
    k4 = -(-k // 4) * 4
    codes = torch.randint(-8, 8, (n, k4 // 4, 4), generator=g, dtype=torch.int16)
    drop = torch.rand(codes.shape, generator=g).argsort(-1)[..., :2]
    return codes.scatter_(-1, drop, 0).reshape(n, k4)[:, :k].contiguous()


def _to(weights, device):
    from dataclasses import replace

    return replace(weights, packed=weights.packed.to(device), scales=weights.scales.to(device),
                   rowsum=weights.rowsum.to(device), meta=None if weights.meta is None else weights.meta.to(device))


@pytest.mark.parametrize("m,n,k", SHAPES)
@pytest.mark.parametrize("a_bits", [8, 4])
def test_dense_int4_gemm_cuda_bit_exact(m, n, k, a_bits):
    g = torch.Generator().manual_seed(m + n + k + a_bits)
    codes = torch.randint(-8, 8, (n, k), generator=g, dtype=torch.int16)
    top = 2 ** (a_bits - 1) - 1
    xq = torch.randint(-top, top + 1, (m, k), generator=g, dtype=torch.int8)
    xs, ws = torch.rand(m, generator=g) + 0.1, torch.rand(n, generator=g) + 0.1
    weights = pack_dense(codes, ws)
    expected = int4_gemm_reference(xq, xs, weights)
    got = int4_gemm(xq.cuda(), xs.cuda(), _to(weights, "cuda"))
    assert got.is_cuda and torch.equal(got.cpu(), expected)


@pytest.mark.parametrize("m,n,k", SHAPES)
def test_sparse24_int4_gemm_cuda_bit_exact(m, n, k):
    g = torch.Generator().manual_seed(7 * m + n + k)
    codes = random_24(n, k, g)
    xq = torch.randint(-127, 128, (m, k), generator=g, dtype=torch.int8)
    xs, ws = torch.rand(m, generator=g) + 0.1, torch.rand(n, generator=g) + 0.1
    weights = pack_24(codes, ws)
    expected = int4_gemm_reference(xq, xs, weights)
    got = int4_gemm(xq.cuda(), xs.cuda(), _to(weights, "cuda"))
    assert torch.equal(got.cpu(), expected)


@pytest.mark.parametrize("m,n,k", SHAPES)
def test_s4_dense_w4a4_cuda_bit_exact(m, n, k):
    g = torch.Generator().manual_seed(3 * m + n + k)
    codes = torch.randint(-8, 8, (n, k), generator=g, dtype=torch.int16)
    x = torch.randint(-8, 8, (m, k), generator=g, dtype=torch.int16)
    xs, ws = torch.rand(m, generator=g) + 0.1, torch.rand(n, generator=g) + 0.1
    kp = -(-k // 64) * 64
    args = (s4_layout(x), xs, s4_layout(codes), ws, kp)
    expected = torch.ops.iclrkit.int4_gemm_s4(*args)  # CPU: the registered reference
    got = torch.ops.iclrkit.int4_gemm_s4(*(a.cuda() if torch.is_tensor(a) else a for a in args))
    assert torch.equal(got.cpu(), expected)


@pytest.mark.parametrize("m,n,k", [(1, 16, 64), (1, 4096, 4096), (3, 40, 300), (16, 11008 // 8, 4096), (37, 24, 128)])
@pytest.mark.parametrize("dtype,tol", [(torch.float16, 1e-3), (torch.bfloat16, 2 ** -7)])
def test_w4a16_cuda_matches_reference(m, n, k, dtype, tol):
    g = torch.Generator().manual_seed(m + n + k)
    codes = torch.randint(-8, 8, (n, k), generator=g, dtype=torch.int16)
    scales = torch.rand(n, generator=g) * 0.02 + 0.001
    x = torch.randn(m, k, generator=g).to(dtype)
    weights = w4a16_layout(codes, scales)
    want = x.float() @ (codes.float() * scales[:, None]).t()
    from dataclasses import replace

    got = w4a16_gemm(x.cuda(), replace(weights, packed=weights.packed.cuda(), scales=weights.scales.cuda()))
    assert got.is_cuda and got.dtype == dtype
    assert float((got.float().cpu() - want).abs().max()) <= tol * float(want.abs().max())


@pytest.mark.parametrize("a_bits,sparse", [(8, "dense"), (8, "24"), (4, "dense"), (16, "dense")])
def test_packed_linear_on_cuda_matches_cpu(a_bits, sparse):
    g = torch.Generator().manual_seed(11)
    codes = random_24(48, 256, g)
    scales = torch.rand(48, generator=g) * 0.05 + 0.01
    bias = torch.randn(48, generator=g)
    layer = PackedInt4Linear.from_codes(codes, scales, bias, a_bits=a_bits, sparse=sparse)
    dtype = torch.float16 if a_bits == 16 else torch.float32
    x = torch.randn(3, 5, 256, generator=g).to(dtype)
    cpu = layer(x)
    gpu_layer = layer.to("cuda")
    assert all(b.is_cuda for b in gpu_layer.buffers())
    got = gpu_layer(x.cuda())
    if a_bits == 16:
        assert float((got.float().cpu() - cpu.float()).abs().max()) <= 2e-3 * float(cpu.float().abs().max())
    else:
        xq, xs = quantize_activations(x.reshape(-1, 256).cuda(), a_bits)
        xq_cpu, _ = quantize_activations(x.reshape(-1, 256), a_bits)
        assert torch.equal(xq.cpu(), xq_cpu)
        assert torch.allclose(got.cpu(), cpu, rtol=1e-6, atol=1e-6)
