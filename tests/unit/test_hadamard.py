import pytest
import torch

from toolkit.core.errors import BadInputError
from toolkit.ops import has_op
from toolkit.ops.hadamard import fwht, fwht_reference, hadamard_matrix, random_hadamard

needs_kernel = pytest.mark.skipif(not has_op("fwht"), reason="toolkit._C not built")


def test_reference_equals_dense_sylvester_matrix():
    n = 16
    H = torch.tensor([[1.0]], dtype=torch.float64)
    while H.shape[0] < n:
        H = torch.cat([torch.cat([H, H], 1), torch.cat([H, -H], 1)], 0)
    x = torch.randn(5, n, dtype=torch.float64)
    torch.testing.assert_close(fwht_reference(x, normalize=False), x @ H, rtol=0, atol=1e-12)


@needs_kernel
@pytest.mark.parametrize("shape", [(1,), (7, 1), (3, 2), (5, 64), (2, 3, 256), (33, 4096)])
def test_kernel_bit_exact_float32(shape):
    n = shape[-1] if len(shape) > 1 else shape[0]
    x = torch.randn(*shape[:-1], n) if len(shape) > 1 else torch.randn(n)
    for normalize in (True, False):
        assert torch.equal(torch.ops.iclrkit.fwht(x, normalize), fwht_reference(x, normalize))


@needs_kernel
def test_kernel_float64_and_noncontiguous_input():
    x = torch.randn(64, 128, dtype=torch.float64).t()  # non-contiguous view
    torch.testing.assert_close(fwht(x), fwht_reference(x.contiguous()), rtol=0, atol=1e-12)


def test_orthonormal_and_involution():
    x = torch.randn(4, 512)
    torch.testing.assert_close(fwht(fwht(x)), x, rtol=0, atol=1e-5)
    Q = random_hadamard(32, seed=3)
    torch.testing.assert_close(Q @ Q.t(), torch.eye(32, dtype=torch.float64), rtol=0, atol=1e-12)
    torch.testing.assert_close(hadamard_matrix(8) @ hadamard_matrix(8), torch.eye(8, dtype=torch.float64))


def test_non_power_of_two_is_rejected():
    with pytest.raises(BadInputError, match="power-of-two"):
        fwht(torch.randn(3, 12))
