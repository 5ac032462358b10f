"""add_gram_: the blocked upper-triangle H += alpha·xᵀx against float64 products, at widths below, at and above one
block, with ragged last blocks, accumulated over batches as HessianAccumulator does."""

import pytest
import torch

from toolkit.linalg.hessian import HessianAccumulator, add_gram_, gram_block


@pytest.mark.parametrize("n", [5, 128, 129, 300, 1031, 1536])
def test_add_gram_equals_the_full_product(n):
    g = torch.Generator().manual_seed(n)
    x = torch.randn(257, n, generator=g)
    start = torch.randn(n, n, generator=g)
    start = start + start.t()
    H = start.clone()
    add_gram_(H, x, alpha=0.25)
    reference = start.double() + 0.25 * x.double().t() @ x.double()
    assert torch.allclose(H.double(), reference, atol=1e-4, rtol=1e-5)
    block = gram_block(n)
    # off the diagonal blocks the lower half is a copy of the upper: exactly symmetric
    for j0 in range(block, n, block):
        assert torch.equal(H[j0:j0 + block, :j0], H[:j0, j0:j0 + block].t())


def test_block_width():
    assert gram_block(576) == 128 and gram_block(1536) == 192 and gram_block(100) == 128


def test_accumulator_mean_over_batches_float64():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 70, 700, generator=g, dtype=torch.float64)
    acc = HessianAccumulator(700)
    for chunk in x:
        acc.add(chunk)
    flat = x.reshape(-1, 700)
    assert torch.allclose(acc.H, 2 * flat.t() @ flat / flat.shape[0], atol=1e-10)
    assert acc.count == 210
