"""Packed INT4 GEMMs as torch ops that dispatch on the tensors' device (toolkit.ops.registry):

- `int4_gemm` / `int4_gemm_24` (W4A8 / W4A4 codes, dense and 2:4 sparse): CPU kernels (AVX-512 VNNI / AVX2) and CUDA
  kernels (s8 Tensor Core MMA) over one weight layout; exact integer accumulation, bit-identical on every device.
- `int4_gemm_s4` (W4A4 on the s4 Tensor Core MMA): CUDA kernel; elsewhere the reference.
Without `toolkit._C` every op runs its pure-torch reference (registered as the CompositeExplicitAutograd kernel).

    y[m, n] = float(acc[m, n]) * x_scale[m] * w_scale[n],   acc = Σ_k xq[m, k] · wq[n, k]   (exact, int)

`xq` are per-token symmetric activation codes (8 or 4 bits), `wq` the per-channel symmetric INT4 weight codes that
`compress obr` writes (toolkit.compress.packed). That on-disk format is one continuous nibble stream (+ a bitmask of
non-zeros) with no per-row addressing, so `to_kernel_layout` converts it once into the blocked layout the kernels read
(documented in csrc/int4/int4_gemm.cpp): 128-column blocks, and for 2:4 the two kept codes per group of four plus
2-bit column indices. The weight-only W4A16 op lives in toolkit.ops.w4a16, the nn.Linear over either layout in
toolkit.ops.packed_linear. Paper: OBR, https://arxiv.org/abs/2509.11177 (official repo csguoh/OBR).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from toolkit.core.errors import BadInputError
from toolkit.ops import registry

BLOCK = 128


def padded(k: int) -> int:
    return -(-k // BLOCK) * BLOCK


def per_token_codes(x: torch.Tensor, bits: int, clip_ratio: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """The house's one per-token activation quantizer: symmetric codes round(x/s) in [−(2^{b−1}−1), 2^{b−1}−1] (the
    range the kernels take: ±7 at 4 bits, ±127 at 8), s = clip·max|x|/(2^{b−1}−1) per token (last dimension), s = 1
    for an all-zero token. Codes (as x's dtype) and scales [..., 1]; `compress`'s fake quantization is codes·s."""
    top = 2 ** (bits - 1) - 1
    amax = x.abs().amax(dim=-1, keepdim=True) * clip_ratio
    scale = torch.where(amax > 0, amax / top, torch.ones_like(amax))
    return torch.clamp(torch.round(x / scale), -top, top), scale


def quantize_activations(x: torch.Tensor, bits: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token symmetric codes (int8 storage) and float32 scales [tokens] (`per_token_codes` on float32)."""
    if not 2 <= bits <= 8:
        raise BadInputError(f"activation bits must be in [2, 8], got {bits}")
    codes, scale = per_token_codes(x.float(), bits)
    return codes.to(torch.int8), scale.squeeze(-1)


@dataclass
class KernelWeights:
    """INT4 weight codes in the kernels' blocked layout; `meta` is None for the dense kernel."""

    packed: torch.Tensor
    meta: torch.Tensor | None
    scales: torch.Tensor
    rowsum: torch.Tensor
    in_features: int

    @property
    def sparse(self) -> bool:
        return self.meta is not None

    def nbytes(self) -> int:
        tensors = [self.packed, self.scales, self.rowsum] + ([self.meta] if self.meta is not None else [])
        return sum(t.numel() * t.element_size() for t in tensors)


def check_codes(codes: torch.Tensor) -> None:
    if codes.dim() != 2 or codes.numel() == 0:
        raise BadInputError(f"weight codes must be a non-empty 2-D matrix, got shape {tuple(codes.shape)}")
    if int(codes.min()) < -8 or int(codes.max()) > 7:
        raise BadInputError("INT4 weight codes must lie in [-8, 7]")


def _nibbles(low: np.ndarray, high: np.ndarray) -> np.ndarray:
    return ((low + 8).astype(np.uint8) | ((high + 8).astype(np.uint8) << 4)).astype(np.uint8)


def pack_dense(codes: torch.Tensor, scales: torch.Tensor) -> KernelWeights:
    """Codes [N, K] in [-8, 7] → dense blocked layout (byte j of a block: column j low, column 64+j high)."""
    check_codes(codes)
    n, k = codes.shape
    full = np.zeros((n, padded(k)), dtype=np.int16)
    full[:, :k] = codes.to(torch.int16).numpy()
    blocks = full.reshape(n, -1, 2, 64)
    packed = _nibbles(blocks[:, :, 0, :], blocks[:, :, 1, :]).reshape(n, -1)
    return KernelWeights(torch.from_numpy(packed), None, scales.float().reshape(-1).contiguous(),
                         codes.to(torch.int32).sum(dim=1, dtype=torch.int32), k)


def pack_24(codes: torch.Tensor, scales: torch.Tensor) -> KernelWeights:
    """Codes [N, K] with at most 2 non-zeros in every group of 4 columns → values + 2-bit column metadata."""
    check_codes(codes)
    n, k = codes.shape
    full = np.zeros((n, padded(k)), dtype=np.int16)
    full[:, :k] = codes.to(torch.int16).numpy()
    groups = full.reshape(n, -1, 4)
    nonzero = groups != 0
    if (nonzero.sum(axis=-1) > 2).any():
        raise BadInputError("weights are not 2:4 sparse (a group of 4 columns has more than 2 non-zeros)")
    # kept columns: the non-zeros first (stable order), padded with zero positions; then sorted by column
    order = np.argsort(~nonzero, axis=-1, kind="stable")[..., :2]
    index = np.sort(order, axis=-1)
    values = np.take_along_axis(groups, index, axis=-1).reshape(n, -1, 64)
    packed = _nibbles(values[:, :, :32], values[:, :, 32:]).reshape(n, -1)
    fields = index.reshape(n, -1, 4).astype(np.uint8)
    meta = (fields[..., 0] | fields[..., 1] << 2 | fields[..., 2] << 4 | fields[..., 3] << 6).astype(np.uint8)
    return KernelWeights(torch.from_numpy(packed), torch.from_numpy(meta), scales.float().reshape(-1).contiguous(),
                         codes.to(torch.int32).sum(dim=1, dtype=torch.int32), k)


def is_24_sparse(codes: torch.Tensor) -> bool:
    n, k = codes.shape
    if k % 4:
        return False
    return bool(((codes.reshape(n, -1, 4) != 0).sum(-1) <= 2).all())


def to_kernel_layout(codes: torch.Tensor, scales: torch.Tensor, sparse: str = "auto") -> KernelWeights:
    """sparse: "auto" (2:4 kernel when the codes are 2:4), "24" (required) or "dense"."""
    if sparse not in ("auto", "24", "dense"):
        raise BadInputError(f"sparse must be auto|24|dense, got {sparse!r}")
    if sparse == "24" or (sparse == "auto" and is_24_sparse(codes)):
        return pack_24(codes, scales)
    return pack_dense(codes, scales)


def unpack_kernel_codes(weights: KernelWeights) -> torch.Tensor:
    """Inverse of pack_dense / pack_24: the codes [N, K] int16 (pure torch, on the weights' device)."""
    if weights.sparse:
        return unpack_24_codes(weights.packed, weights.meta, weights.in_features)
    return unpack_dense_codes(weights.packed, weights.in_features)


def unpack_dense_codes(packed: torch.Tensor, k: int) -> torch.Tensor:
    n = packed.shape[0]
    low = (packed & 0x0F).to(torch.int16) - 8
    high = (packed >> 4).to(torch.int16) - 8
    return torch.stack([low.reshape(n, -1, 64), high.reshape(n, -1, 64)], dim=2).reshape(n, -1)[:, :k]


def unpack_24_codes(values: torch.Tensor, meta: torch.Tensor, k: int) -> torch.Tensor:
    n = values.shape[0]
    low = (values & 0x0F).to(torch.int16) - 8
    high = (values >> 4).to(torch.int16) - 8
    kept = torch.cat([low.reshape(n, -1, 32), high.reshape(n, -1, 32)], dim=2).reshape(n, -1, 2)
    fields = torch.stack([(meta >> s) & 3 for s in (0, 2, 4, 6)], dim=-1).reshape(n, -1, 2).to(torch.int64)
    groups = torch.zeros(n, kept.shape[1], 4, dtype=torch.int16, device=values.device)
    groups.scatter_(-1, fields, kept)
    return groups.reshape(n, -1)[:, :k]


def _exact_products(xq: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
    """Σ_k xq·code as int32: a float64 matmul is exact here (|acc| ≤ 128·8·K ≪ 2^53) and runs on any device."""
    return (xq.to(torch.float64) @ codes.to(torch.float64).t()).round().to(torch.int32)


def _finish(acc: torch.Tensor, x_scale: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
    """float(acc) · x_scale[m] · w_scale[n]: the kernels' rounding order."""
    return acc.float() * x_scale.float().reshape(-1, 1) * w_scale.float().reshape(1, -1)


def _int4_gemm_ref(xq, x_scale, w, w_scale, rowsum, k, path):
    return _finish(_exact_products(xq, unpack_dense_codes(w, k)), x_scale, w_scale)


def _int4_gemm_24_ref(xq, x_scale, values, meta, w_scale, rowsum, k, path):
    return _finish(_exact_products(xq, unpack_24_codes(values, meta, k)), x_scale, w_scale)


def _gemm_fake(xq, x_scale, w, w_scale, *rest):
    return xq.new_empty((xq.shape[0], w_scale.shape[0]), dtype=torch.float32)


def _signed_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """[R, Kp/2] two's-complement nibbles (low = lower column) -> int16 codes [R, Kp]."""
    low = (packed & 0x0F).to(torch.int16)
    high = (packed >> 4).to(torch.int16)
    codes = torch.stack([low, high], dim=-1).reshape(packed.shape[0], -1)
    return torch.where(codes >= 8, codes - 16, codes)


def _int4_gemm_s4_ref(x, x_scale, w, w_scale, kp):
    return _finish(_exact_products(_signed_nibbles(x), _signed_nibbles(w)), x_scale, w_scale)


def _s4_fake(x, x_scale, w, w_scale, kp):
    return x.new_empty((x.shape[0], w.shape[0]), dtype=torch.float32)


registry.register("int4_gemm", "int4_gemm(Tensor xq, Tensor x_scale, Tensor w, Tensor w_scale, Tensor rowsum, "
                  "int k, str path) -> Tensor", _int4_gemm_ref, _gemm_fake)
registry.register("int4_gemm_24", "int4_gemm_24(Tensor xq, Tensor x_scale, Tensor values, Tensor meta, "
                  "Tensor w_scale, Tensor rowsum, int k, str path) -> Tensor", _int4_gemm_24_ref,
                  lambda xq, x_scale, values, meta, w_scale, *rest: _gemm_fake(xq, x_scale, values, w_scale))
registry.register("int4_gemm_s4", "int4_gemm_s4(Tensor x, Tensor x_scale, Tensor w, Tensor w_scale, int kp) "
                  "-> Tensor", _int4_gemm_s4_ref, _s4_fake)


def int4_gemm_reference(xq: torch.Tensor, x_scale: torch.Tensor, weights: KernelWeights) -> torch.Tensor:
    """Exact integer accumulation, then the same float rounding order as the kernels (pure torch, any device)."""
    args = (xq, x_scale, weights.packed) + ((weights.meta,) if weights.sparse else ())
    ref = _int4_gemm_24_ref if weights.sparse else _int4_gemm_ref
    return ref(*args, weights.scales, weights.rowsum, weights.in_features, "auto")


def int4_gemm(xq: torch.Tensor, x_scale: torch.Tensor, weights: KernelWeights, path: str = "auto") -> torch.Tensor:
    """y [M, N] = dequantised (xq · wqᵀ) on xq's device; path auto|scalar|avx2|vnni picks the CPU kernel's code path
    (the CUDA kernel has one)."""
    if xq.dim() != 2 or xq.shape[1] != weights.in_features:
        raise BadInputError(f"activations {tuple(xq.shape)} do not match {weights.in_features} input features")
    args = (xq.to(torch.int8), x_scale.float())
    if weights.sparse:
        return torch.ops.iclrkit.int4_gemm_24(*args, weights.packed, weights.meta, weights.scales, weights.rowsum,
                                              weights.in_features, path)
    return torch.ops.iclrkit.int4_gemm(*args, weights.packed, weights.scales, weights.rowsum, weights.in_features,
                                       path)


def s4_layout(codes: torch.Tensor, multiple: int = 64) -> torch.Tensor:
    """Codes [R, K] in [-8, 7] → signed two's-complement nibbles [R, Kp/2] (low nibble = lower column), Kp a multiple
    of 64: the operand layout of `int4_gemm_s4` (activations and weights alike)."""
    rows, k = codes.shape
    kp = -(-k // multiple) * multiple
    full = torch.zeros(rows, kp, dtype=torch.int16, device=codes.device)
    full[:, :k] = codes.to(torch.int16)
    nibbles = (full & 0x0F).to(torch.uint8)
    return (nibbles[:, 0::2] | (nibbles[:, 1::2] << 4)).contiguous()
