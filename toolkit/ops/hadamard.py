"""Walsh–Hadamard transform: `torch.ops.iclrkit.fwht`, the compiled CPU kernel (float32/float64) where built, the
pure-torch reference on other devices and without `toolkit._C` (toolkit.ops.registry)."""

from __future__ import annotations

import math

import numpy as np
import torch

from toolkit.core.errors import BadInputError
from toolkit.ops import registry


def _check(x: torch.Tensor) -> int:
    n = x.shape[-1]
    if n <= 0 or n & (n - 1):
        raise BadInputError(f"Hadamard transform needs a power-of-two last dimension, got {n}")
    return n


def fwht_reference(x: torch.Tensor, normalize: bool = True) -> torch.Tensor:
    """x @ H_n (Sylvester order), scaled by 1/sqrt(n) when normalize; same butterfly order as the kernel."""
    n = _check(x)
    shape = x.shape
    y = x.reshape(-1, n).clone()
    h = 1
    while h < n:
        y = y.view(-1, n // (2 * h), 2, h)
        a, b = y[:, :, 0, :], y[:, :, 1, :]
        y = torch.stack((a + b, a - b), dim=2).reshape(-1, n)
        h *= 2
    if normalize:
        y = y * torch.tensor(1.0 / math.sqrt(n), dtype=y.dtype, device=y.device)
    return y.reshape(shape)


registry.register("fwht", "fwht(Tensor x, bool normalize) -> Tensor", fwht_reference,
                  lambda x, normalize: torch.empty_like(x, memory_format=torch.contiguous_format))


def fwht(x: torch.Tensor, normalize: bool = True) -> torch.Tensor:
    """The op for float32/float64 (whose CPU kernel is compiled); other dtypes (bf16/fp16 activations) run the
    reference in their own dtype on their own device."""
    _check(x)
    if x.dtype in (torch.float32, torch.float64):
        return torch.ops.iclrkit.fwht(x, normalize)
    return fwht_reference(x, normalize)


def hadamard_matrix(n: int, dtype=torch.float64) -> torch.Tensor:
    """The orthonormal Sylvester Hadamard matrix H_n / sqrt(n)."""
    return fwht_reference(torch.eye(n, dtype=dtype), normalize=True)


def random_hadamard(n: int, seed: int = 0, dtype=torch.float64) -> torch.Tensor:
    """Q = diag(random ±1) · H_n/sqrt(n): orthogonal, as QuaRot's randomised Hadamard rotation."""
    signs = torch.randint(0, 2, (n,), generator=torch.Generator().manual_seed(seed)).to(dtype) * 2 - 1
    return signs[:, None] * hadamard_matrix(n, dtype)


# -- exact Hadamard matrices for n = 2^k·m: Sylvester doubling × a Paley construction, built at run time ----------
#
# A Hadamard matrix of order m (entries ±1, H·Hᵀ = m·I) exists by Paley's constructions when
#   Paley I:  m = q + 1,     q a prime power ≡ 3 (mod 4)   (12, 20, 24, 28, 32, 44, 48, 60, 68, 72, 80, 84, ...)
#   Paley II: m = 2(q + 1),  q a prime power ≡ 1 (mod 4)   (12, 20, 28, 36, 52, 60, 76, 100, ...)
# and the Kronecker product with a Sylvester H_{2^j} keeps the property, so n = 2^j·m has one whenever some split of
# n does. Both use the quadratic character χ of the finite field GF(q), computed here from GF(q)'s own arithmetic
# (polynomials over GF(p) modulo an irreducible one for q = p^k), so no table is stored anywhere.


def _prime_power(q: int) -> tuple[int, int] | None:
    """(p, k) with q = p^k for a prime p, else None."""
    if q < 2:
        return None
    p = next((d for d in range(2, int(q ** 0.5) + 1) if q % d == 0), q)
    k = 0
    while q % p == 0:
        q //= p
        k += 1
    return (p, k) if q == 1 else None


def _poly_mod(a: list[int], f: list[int], p: int) -> list[int]:
    """a mod f over GF(p); coefficient lists, lowest degree first, f monic."""
    a = list(a)
    while len(a) >= len(f):
        lead = a[-1] % p
        if lead:
            shift = len(a) - len(f)
            for i, c in enumerate(f):
                a[shift + i] = (a[shift + i] - lead * c) % p
        a.pop()
    return [c % p for c in a]


def _irreducible(p: int, k: int) -> list[int]:
    """The first monic polynomial of degree k over GF(p) (lowest degree first) that no monic polynomial of degree
    1..k//2 divides."""
    def monic(degree: int):
        for code in range(p ** degree):
            yield [(code // p ** i) % p for i in range(degree)] + [1]

    for f in monic(k):
        if all(any(_poly_mod(f, g, p)) for d in range(1, k // 2 + 1) for g in monic(d)):
            return f
    raise AssertionError(f"no irreducible polynomial of degree {k} over GF({p})")  # never: one always exists


def _field(q: int) -> tuple[np.ndarray, np.ndarray]:
    """GF(q) as (digits [q, k]: element e's coefficients, e = Σ digits·p^i; χ [q]: 0 at 0, +1 on the non-zero
    squares, −1 elsewhere)."""
    p, k = _prime_power(q)
    digits = np.array([[(e // p ** i) % p for i in range(k)] for e in range(q)], dtype=np.int64)
    f = _irreducible(p, k) if k > 1 else [0, 1]
    weights = p ** np.arange(k)
    chi = -np.ones(q, dtype=np.int64)
    chi[0] = 0
    for e in range(1, q):
        a = digits[e].tolist()
        square = [0] * (2 * k - 1)
        for i, x in enumerate(a):
            for j, y in enumerate(a):
                square[i + j] += x * y
        reduced = _poly_mod(square, f, p) if k > 1 else [square[0] % p]
        chi[int(np.dot(reduced + [0] * (k - len(reduced)), weights))] = 1
    return digits, chi


def _jacobsthal(q: int) -> np.ndarray:
    """Q[a, b] = χ(a − b) over GF(q)."""
    p, _ = _prime_power(q)
    digits, chi = _field(q)
    weights = p ** np.arange(digits.shape[1])
    difference = (digits[:, None, :] - digits[None, :, :]) % p
    return chi[difference @ weights]


def paley_hadamard(m: int) -> np.ndarray | None:
    """A ±1 Hadamard matrix of order m (int64) by Paley I or II, or None when neither applies to m."""
    q = m - 1
    pp = _prime_power(q)
    if pp and q % 4 == 3:  # Paley I: H = I + [[0, 1ᵀ], [−1, Q]] (Q skew-symmetric)
        S = np.zeros((m, m), dtype=np.int64)
        S[0, 1:], S[1:, 0], S[1:, 1:] = 1, -1, _jacobsthal(q)
        return np.eye(m, dtype=np.int64) + S
    q = m // 2 - 1
    pp = _prime_power(q) if m % 2 == 0 else None
    if pp and q % 4 == 1:  # Paley II: C = [[0, 1ᵀ], [1, Q]] (symmetric); 0 → [[1,−1],[−1,−1]], ±1 → ±[[1,1],[1,−1]]
        C = np.zeros((q + 1, q + 1), dtype=np.int64)
        C[0, 1:], C[1:, 0], C[1:, 1:] = 1, 1, _jacobsthal(q)
        return (np.kron(C, np.array([[1, 1], [1, -1]])) +
                np.kron(np.eye(q + 1, dtype=np.int64), np.array([[1, -1], [-1, -1]])))
    return None


def hadamard_split(n: int) -> tuple[int, int] | None:
    """(p, m) with n = p·m, p a power of two and m = 1 or a Paley order (the smallest such m), or None when this
    construction has no Hadamard matrix of order n (every odd n > 1, every n ≡ 2 mod 4 above 2, and the rest)."""
    if n < 1:
        return None
    p = n & -n
    while p >= 1:
        m = n // p
        if m == 1 or (m % 4 == 0 and paley_hadamard_exists(m)):
            return p, m
        p //= 2
    return None


def paley_hadamard_exists(m: int) -> bool:
    q1, q2 = m - 1, m // 2 - 1
    return bool((_prime_power(q1) and q1 % 4 == 3) or (m % 2 == 0 and _prime_power(q2) and q2 % 4 == 1))


def exact_hadamard(n: int, dtype=torch.float64) -> torch.Tensor:
    """The ±1 Hadamard matrix H_p ⊗ H_m of order n (H·Hᵀ = n·I, unnormalised; Sylvester H_p, Paley H_m), in the
    index order i = i_p·m + i_m. BadInputError when `hadamard_split(n)` finds none."""
    split = hadamard_split(n)
    if split is None:
        raise BadInputError(f"no exact Hadamard construction for order {n} (2^k times a Paley order)")
    p, m = split
    block = torch.ones(1, 1, dtype=torch.int64) if m == 1 else torch.from_numpy(paley_hadamard(m))
    sylvester = fwht_reference(torch.eye(p, dtype=torch.float64), normalize=False).round().to(torch.int64)
    return torch.kron(sylvester, block).to(dtype)
