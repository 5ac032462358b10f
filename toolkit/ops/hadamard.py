"""Walsh–Hadamard transform: `torch.ops.iclrkit.fwht`, the compiled CPU kernel (float32/float64) where built, the
pure-torch reference on other devices and without `toolkit._C` (toolkit.ops.registry)."""

from __future__ import annotations

import math

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
