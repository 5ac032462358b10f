"""`w4a16_gemm` (weight-only INT4, 16-bit activations, decode shapes) as a torch op that dispatches on the tensors'
device (toolkit.ops.registry): CUDA kernel (FP16/BF16 MMA, codes dequantised in registers, csrc/int4/w4a16_cuda.cu);
the CPU path and every device without `toolkit._C` run the pure-torch reference.

    y[m, n] = x[m, :] · (codes[n, :] · scale[n])   in x's dtype

The codes are the per-channel symmetric INT4 codes of toolkit.ops.int4; `w4a16_layout` lays them out once, at load,
in the kernel's fragment layout.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from toolkit.core.errors import BadInputError
from toolkit.ops import registry
from toolkit.ops.int4 import check_codes

W4A16_K = 64  # columns per 16-byte load of the W4A16 layout (four 16-column k-tiles)


@dataclass
class W4A16Weights:
    """INT4 codes in the W4A16 kernel's fragment layout (csrc/int4/w4a16_cuda.cu): int32 [N/16, Kp/64, 32, 4]."""

    packed: torch.Tensor
    scales: torch.Tensor
    in_features: int
    out_features: int
    meta = None
    sparse = False

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.packed, self.scales))


def _w4a16_view(n: int, k: int) -> tuple[int, int]:
    return -(-n // 16), -(-k // W4A16_K)


def w4a16_layout(codes: torch.Tensor, scales: torch.Tensor) -> W4A16Weights:
    """Codes [N, K] in [-8, 7] → the W4A16 layout, prepared once at load. Word (i, j, lane, r): lane = 4g + t holds
    the m16n8k16 A fragment of channel tile i and k-tile 4j + r; fragment register q covers row g + 8(q&1), columns
    2t + 8(q>>1) and +1, whose codes (+8) sit at nibbles q and q + 4 of the word."""
    check_codes(codes)
    n, k = codes.shape
    tiles, chunks = _w4a16_view(n, k)
    full = torch.zeros(tiles * 16, chunks * W4A16_K, dtype=torch.int64, device=codes.device)
    full[:n, :k] = codes.to(torch.int64) + 8
    full[n:] = 8  # padding channels / columns hold code 0 (+8): they add nothing
    full[:, k:] = 8
    # (i, h, g, kt, c, t, e): row 16i + 8h + g, column 16kt + 8c + 2t + e; register q = h + 2c, nibble q + 4e
    grid = full.reshape(tiles, 2, 8, chunks * 4, 2, 4, 2)
    bit = torch.arange(2, device=full.device)
    h, c, e = bit.view(1, 2, 1, 1, 1, 1, 1), bit.view(1, 1, 1, 1, 2, 1, 1), bit.view(1, 1, 1, 1, 1, 1, 2)
    shift = 4 * (h + 2 * c + 4 * e)
    words = (grid << shift).sum(dim=(1, 4, 6)).permute(0, 2, 1, 3)  # (i, g, kt, t) -> [tiles, kt, 8 (g), 4 (t)]
    words = words.reshape(tiles, chunks, 4, 8, 4).permute(0, 1, 3, 4, 2).reshape(tiles, chunks, 32, 4)
    words = torch.where(words >= 2 ** 31, words - 2 ** 32, words).to(torch.int32).contiguous()
    return W4A16Weights(words, scales.float().reshape(-1).contiguous(), k, n)


def w4a16_unpack(packed: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """Inverse of w4a16_layout: codes [N, K] int16 (pure torch, on the layout's device)."""
    tiles, chunks = packed.shape[0], packed.shape[1]
    words = packed.to(torch.int64) & 0xFFFFFFFF
    words = words.reshape(tiles, chunks, 8, 4, 4).permute(0, 1, 4, 2, 3).reshape(tiles, chunks * 4, 8, 4)
    q = torch.arange(4, device=packed.device)
    shifts = torch.stack([4 * q, 4 * (q + 4)], dim=-1)  # [q, e]
    nib = (words[..., None, None] >> shifts) & 0xF  # [tiles, kt, g, t, q, e]
    nib = nib.reshape(tiles, chunks * 4, 8, 4, 2, 2, 2)  # q = h + 2c -> (c, h)
    # to (i, h, g, kt, c, t, e)
    grid = nib.permute(0, 5, 2, 1, 4, 3, 6)
    full = grid.reshape(tiles * 16, chunks * W4A16_K)
    return (full[:n, :k] - 8).to(torch.int16)


def _w4a16_ref(x, w, scales, n, k):
    codes = w4a16_unpack(w, n, k)
    return ((x.float() @ codes.float().t()) * scales.float()).to(x.dtype)


def _w4a16_fake(x, w, scales, n, k):
    return x.new_empty((x.shape[0], n))


registry.register("w4a16_gemm", "w4a16_gemm(Tensor x, Tensor w, Tensor scales, int n, int k) -> Tensor",
                  _w4a16_ref, _w4a16_fake)


def w4a16_gemm(x: torch.Tensor, weights: W4A16Weights) -> torch.Tensor:
    """y [M, N] = x · (codes · scale)ᵀ in x's dtype, on x's device."""
    if x.dim() != 2 or x.shape[1] != weights.in_features:
        raise BadInputError(f"activations {tuple(x.shape)} do not match {weights.in_features} input features")
    return torch.ops.iclrkit.w4a16_gemm(x, weights.packed, weights.scales, weights.out_features, weights.in_features)
