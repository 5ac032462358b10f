"""Exact Hadamard matrices for n = 2^k·m (Sylvester × Paley I/II), built at run time, and the online rotation path
that applies them (Walsh–Hadamard over 2^k, matmul over m) against the dense matrix."""

import pytest
import torch

from toolkit.compress.orthogonal import EXACT, KRON, CrossHeadRotation, OrthogonalRotation
from toolkit.ops.hadamard import exact_hadamard, hadamard_split, paley_hadamard


@pytest.mark.parametrize("n", [12, 20, 28, 36, 40, 576, 1536, 768, 2048, 3072])
def test_exact_hadamard_is_hadamard(n):
    H = exact_hadamard(n)
    assert H.dtype == torch.float64 and H.shape == (n, n)
    assert torch.equal(H.abs(), torch.ones(n, n, dtype=torch.float64))  # entries ±1
    # ±1 entries and sums of at most n terms: fp64 products are exact integers
    assert torch.equal(H @ H.t(), n * torch.eye(n, dtype=torch.float64))


@pytest.mark.parametrize("m", [12, 20, 28, 36, 44, 52, 60, 68, 76, 84, 100, 108, 140])
def test_paley_blocks_integer_exact(m):
    """Paley I (q = m−1 ≡ 3 mod 4: 12, 20, 28 = 27+1 over GF(3³), 44, 60, 68, 84, 108, 140) and Paley II (q = m/2−1
    ≡ 1 mod 4: 36 over GF(17), 52 over GF(5²), 76, 100), in integers."""
    H = torch.from_numpy(paley_hadamard(m))
    assert H.dtype == torch.int64 and set(H.unique().tolist()) == {-1, 1}
    assert torch.equal(H @ H.t(), m * torch.eye(m, dtype=torch.int64))


def test_split_of_model_widths_and_impossible_orders():
    assert hadamard_split(576) == (16, 36)  # SmolLM2 hidden
    assert hadamard_split(1536) == (128, 12)  # SmolLM2 intermediate
    assert hadamard_split(2048) == (2048, 1)
    assert hadamard_split(672) == (8, 84)
    for n in (3, 6, 9, 10, 18, 92):  # odd, ≡ 2 mod 4, or (92) no Paley order
        assert hadamard_split(n) is None


@pytest.mark.parametrize("n", [2048, 1536, 576, 12])
def test_online_path_equals_x_times_h_over_sqrt_n(n):
    """The online hook's rotation (fwht alone for 2048; matmul over m then fwht for 1536 = 128·12) is x @ H/√n."""
    rotation = OrthogonalRotation(n, seed=7, signs=False)
    assert rotation.kind == EXACT
    x = torch.randn(3, 5, n, dtype=torch.float64, generator=torch.Generator().manual_seed(n))
    torch.testing.assert_close(rotation.apply(x), x @ exact_hadamard(n) / n ** 0.5, rtol=0, atol=1e-10)
    for dtype in (torch.float32, torch.bfloat16):
        y = rotation.apply(x.to(dtype))
        assert y.dtype == dtype
        torch.testing.assert_close(y.double(), x @ exact_hadamard(n) / n ** 0.5, rtol=0,
                                   atol=0.1 if dtype == torch.bfloat16 else 1e-4)


def test_random_signed_exact_rotation_is_a_signed_hadamard():
    """The residual rotation: Q = D·H/√n (QuaRot's random Hadamard), entries ±1/√n, orthogonal."""
    n = 576
    rotation = OrthogonalRotation(n, seed=3)
    Q = rotation.matrix()
    torch.testing.assert_close(Q.abs() * n ** 0.5, torch.ones(n, n, dtype=torch.float64), rtol=0, atol=1e-12)
    torch.testing.assert_close(Q @ Q.t(), torch.eye(n, dtype=torch.float64), rtol=0, atol=1e-10)
    torch.testing.assert_close(Q, rotation.pre_signs[:, None] * exact_hadamard(n) / n ** 0.5, rtol=0, atol=1e-12)


def test_fallback_where_no_construction_exists_and_legacy_rebuild():
    """Odd widths (9 heads) get the kron-orthogonal rotation; forcing it rebuilds exactly what every packed file
    written before exact Hadamards holds: (D·H_p) ⊗ B, D then B drawn from one generator in that order."""
    assert OrthogonalRotation(9, seed=1).kind == KRON
    n, seed = 1536, 4
    legacy = OrthogonalRotation(n, seed, KRON, signs=False)
    generator = torch.Generator().manual_seed(seed)
    signs = torch.randint(0, 2, (512,), generator=generator).to(torch.float64) * 2 - 1
    q, r = torch.linalg.qr(torch.randn(3, 3, generator=generator, dtype=torch.float64))
    block = q * torch.sign(torch.diagonal(r)).unsqueeze(0)
    sylvester = exact_hadamard(512) / 512 ** 0.5
    torch.testing.assert_close(legacy.matrix(), torch.kron(signs[:, None] * sylvester, block.contiguous()), rtol=0, atol=1e-10)
    with pytest.raises(Exception, match="no exact Hadamard"):
        OrthogonalRotation(9, seed=1, kind=EXACT)


@pytest.mark.parametrize("heads,head_dim,kind", [(12, 8, EXACT), (4, 16, EXACT), (9, 8, KRON)])
def test_cross_head_rotation_is_kron_over_heads(heads, head_dim, kind):
    cross = CrossHeadRotation(heads, head_dim, seed=2)
    assert cross.kind == kind
    G = cross.matrix()
    expected = torch.kron(cross.inner.matrix(), torch.eye(head_dim, dtype=torch.float64))
    torch.testing.assert_close(G, expected, rtol=0, atol=1e-12)
    torch.testing.assert_close(G @ G.t(), torch.eye(heads * head_dim, dtype=torch.float64), rtol=0, atol=1e-10)
    if kind == EXACT:
        torch.testing.assert_close(cross.inner.matrix(), exact_hadamard(heads) / heads ** 0.5, rtol=0, atol=1e-12)
