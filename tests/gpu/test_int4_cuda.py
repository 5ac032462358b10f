"""CUDA INT4 kernels (mma.sync s4 dense W4A4, mma.sp s8 2:4 W4A8) against the integer reference; skipped without a
GPU build. Run on a GPU machine: examples/int4/gpu_check.sh."""

import pytest
import torch

from toolkit.ops import has_op
from toolkit.ops.int4 import (
    cuda_24_layout,
    cuda_dense_layout,
    int4_gemm_reference,
    pack_24,
    pack_dense,
    padded,
)

pytestmark = pytest.mark.skipif(not (torch.cuda.is_available() and has_op("int4_gemm_cuda")),
                                reason="needs CUDA and toolkit._C built with CUDA")


def random_24(n, k, g):
    codes = torch.randint(-8, 8, (n, k // 4, 4), generator=g, dtype=torch.int16)
    drop = torch.rand(codes.shape, generator=g).argsort(-1)[..., :2]
    return codes.scatter_(-1, drop, 0).reshape(n, k)


@pytest.mark.parametrize("m,n,k", [(1, 8, 64), (16, 8, 64), (5, 13, 100), (33, 40, 320), (64, 256, 4096)])
def test_dense_w4a4_mma_matches_reference(m, n, k):
    g = torch.Generator().manual_seed(m + n + k)
    codes = torch.randint(-8, 8, (n, k), generator=g, dtype=torch.int16)
    xq = torch.randint(-7, 8, (m, k), generator=g, dtype=torch.int8)
    xs, ws = torch.rand(m, generator=g) + 0.1, torch.rand(n, generator=g) + 0.1
    expected = int4_gemm_reference(xq, xs, pack_dense(codes, ws))
    kp = -(-k // 64) * 64
    y = torch.ops.iclrkit.int4_gemm_cuda(cuda_dense_layout(xq).cuda(), xs.cuda(), cuda_dense_layout(codes).cuda(),
                                         ws.cuda(), kp)
    assert torch.equal(y.cpu(), expected)


@pytest.mark.parametrize("m,n,k", [(1, 16, 128), (8, 16, 128), (5, 19, 256), (33, 40, 384), (64, 256, 4096)])
def test_sparse24_w4a8_mma_sp_matches_reference(m, n, k):
    g = torch.Generator().manual_seed(7 * m + n + k)
    codes = random_24(n, k, g)
    xq = torch.randint(-127, 128, (m, k), generator=g, dtype=torch.int8)
    xs, ws = torch.rand(m, generator=g) + 0.1, torch.rand(n, generator=g) + 0.1
    weights = pack_24(codes, ws)
    expected = int4_gemm_reference(xq, xs, weights)
    values, meta = cuda_24_layout(weights)
    kp = padded(k)
    x = torch.zeros(m, kp, dtype=torch.int8)
    x[:, :k] = xq
    y = torch.ops.iclrkit.int4_gemm_24_cuda(x.cuda(), xs.cuda(), values.cuda(), meta.contiguous().cuda(), ws.cuda(),
                                            kp)
    assert torch.equal(y.cpu(), expected)
