"""The orthogonal rotations QuaRot-style rotation uses (toolkit.compress.rotation): an exact Hadamard where one is
constructed for the width (`toolkit.ops.hadamard.hadamard_split`: n = 2^k·m, m = 1 or a Paley order), else a
power-of-two Hadamard ⊗ a random orthogonal block ("kron-orthogonal"); applied by their factors (a matmul over m,
then a Walsh–Hadamard over 2^k), never as a dense n×n matrix."""

from __future__ import annotations

import torch

from toolkit.core.errors import BadInputError
from toolkit.ops.hadamard import fwht, hadamard_split, paley_hadamard


def split_power_of_two(n: int) -> tuple[int, int]:
    """n = p·m with p the largest power of two dividing n."""
    p = n & -n
    return p, n // p


EXACT, KRON = "exact", "kron-orthogonal"


class OrthogonalRotation:
    """An orthogonal Q of order n, deterministic in (n, seed, kind, signs); `apply(x)` computes x @ Q along the last
    dimension as a matmul over m then a Walsh–Hadamard over p (n = p·m).

    kind "exact": Q = D·(H_p ⊗ H_m)/√n, a true Hadamard (H_m from Paley), D random signs over all n (identity with
    signs=False: then Q = H_n/√n). kind "kron-orthogonal": Q = (D·H_p) ⊗ B, B random orthogonal (the only kind
    before exact Hadamards; `signs` is ignored, as it always drew its signs). kind "auto": exact where
    `hadamard_split(n)` finds a construction, else kron-orthogonal."""

    def __init__(self, n: int, seed: int, kind: str = "auto", signs: bool = True):
        if kind not in ("auto", EXACT, KRON):
            raise BadInputError(f"unknown rotation kind {kind!r}")
        split = hadamard_split(n) if kind != KRON else None
        if kind == EXACT and split is None:
            raise BadInputError(f"no exact Hadamard of order {n}")
        self.n, self.seed = n, seed
        self.kind = EXACT if split is not None else KRON
        generator = torch.Generator().manual_seed(seed)
        self.pre_signs = None  # [n] (exact kind): x·D before the Hadamard
        self.post_signs = None  # [p] (kron-orthogonal kind): signs over p after the block
        if self.kind == EXACT:
            self.p, self.m = split
            block = torch.ones(1, 1, dtype=torch.int64) if self.m == 1 else torch.from_numpy(paley_hadamard(self.m))
            self.block = block.to(torch.float64) / float(self.m) ** 0.5
            if signs:
                self.pre_signs = torch.randint(0, 2, (n,), generator=generator).to(torch.float64) * 2 - 1
        else:
            self.p, self.m = split_power_of_two(n)
            self.post_signs = torch.randint(0, 2, (self.p,), generator=generator).to(torch.float64) * 2 - 1
            if self.m > 1:
                gaussian = torch.randn(self.m, self.m, generator=generator, dtype=torch.float64)
                q, r = torch.linalg.qr(gaussian)
                self.block = q * torch.sign(torch.diagonal(r)).unsqueeze(0)
            else:
                self.block = torch.ones(1, 1, dtype=torch.float64)
        self._cache: dict[tuple[torch.device, torch.dtype], tuple] = {}

    def factors(self, device: torch.device, dtype: torch.dtype) -> tuple:
        """(block B, signs over n or None, signs over p as a column or None) on `device` in `dtype`, made once per
        (device, dtype)."""
        key = (torch.device(device), dtype)
        if key not in self._cache:
            def put(t):
                return None if t is None else t.to(device=device, dtype=dtype)

            post = put(self.post_signs)
            self._cache[key] = (put(self.block), put(self.pre_signs), None if post is None else post.unsqueeze(1))
        return self._cache[key]

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        block, pre, post = self.factors(x.device, x.dtype)
        if pre is not None:
            x = x * pre
        y = x.reshape(*shape[:-1], self.p, self.m)
        if self.m > 1:
            y = y @ block
        if post is not None:
            y = y * post
        if self.p > 1:
            y = fwht(y.transpose(-1, -2).contiguous()).transpose(-1, -2)
        return y.reshape(shape)

    def matrix(self, device: str | torch.device | None = None) -> torch.Tensor:
        """Q (float64) on `device` (default CPU)."""
        return self.apply(torch.eye(self.n, dtype=torch.float64, device=device))


class CrossHeadRotation:
    """The online rotation before o_proj: G = R_heads ⊗ I_head_dim (QuaRot's `online_partial_had`), R_heads the
    plain Hadamard over the head index (exact where one exists, else kron-orthogonal); `apply(x)` = x @ G."""

    def __init__(self, heads: int, head_dim: int, seed: int, kind: str = "auto"):
        self.heads, self.head_dim, self.n = heads, head_dim, heads * head_dim
        self.inner = OrthogonalRotation(heads, seed, kind, signs=False)
        self.kind = self.inner.kind

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        y = x.reshape(*shape[:-1], self.heads, self.head_dim).transpose(-1, -2)
        return self.inner.apply(y).transpose(-1, -2).reshape(shape)

    def matrix(self, device: str | torch.device | None = None) -> torch.Tensor:
        return self.apply(torch.eye(self.n, dtype=torch.float64, device=device))
