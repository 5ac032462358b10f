"""Packed INT4 GEMMs as torch ops that dispatch on the tensors' device (toolkit.ops.registry):

- `int4_gemm` / `int4_gemm_24` (W4A8 / W4A4 codes, dense and 2:4 sparse): CPU kernels (AVX-512 VNNI / AVX2) and CUDA
  kernels (s8 Tensor Core MMA) over one weight layout; exact integer accumulation, bit-identical on every device.
- `int4_gemm_s4` (W4A4 on the s4 Tensor Core MMA): CUDA kernel; elsewhere the reference.
- `w4a16_gemm` (weight-only INT4, 16-bit activations, decode shapes): CUDA kernel (FP16/BF16 MMA, codes dequantised
  in registers); the CPU path is the reference.
Without `toolkit._C` every op runs its pure-torch reference (registered as the CompositeExplicitAutograd kernel).

    y[m, n] = float(acc[m, n]) * x_scale[m] * w_scale[n],   acc = Σ_k xq[m, k] · wq[n, k]   (exact, int)

`xq` are per-token symmetric activation codes (8 or 4 bits), `wq` the per-channel symmetric INT4 weight codes that
`compress obr` writes (toolkit.compress.packed). That on-disk format is one continuous nibble stream (+ a bitmask of
non-zeros) with no per-row addressing, so `to_kernel_layout` converts it once into the blocked layout the kernels read
(documented in csrc/int4/int4_gemm.cpp): 128-column blocks, and for 2:4 the two kept codes per group of four plus
2-bit column indices. Paper: OBR, https://arxiv.org/abs/2509.11177 (official repo csguoh/OBR).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from toolkit.core.errors import BadInputError
from toolkit.ops import registry

BLOCK = 128
W4A16_K = 64  # columns per 16-byte load of the W4A16 layout (four 16-column k-tiles)


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


def _check_codes(codes: torch.Tensor) -> None:
    if codes.dim() != 2 or codes.numel() == 0:
        raise BadInputError(f"weight codes must be a non-empty 2-D matrix, got shape {tuple(codes.shape)}")
    if int(codes.min()) < -8 or int(codes.max()) > 7:
        raise BadInputError("INT4 weight codes must lie in [-8, 7]")


def _nibbles(low: np.ndarray, high: np.ndarray) -> np.ndarray:
    return ((low + 8).astype(np.uint8) | ((high + 8).astype(np.uint8) << 4)).astype(np.uint8)


def pack_dense(codes: torch.Tensor, scales: torch.Tensor) -> KernelWeights:
    """Codes [N, K] in [-8, 7] → dense blocked layout (byte j of a block: column j low, column 64+j high)."""
    _check_codes(codes)
    n, k = codes.shape
    full = np.zeros((n, padded(k)), dtype=np.int16)
    full[:, :k] = codes.to(torch.int16).numpy()
    blocks = full.reshape(n, -1, 2, 64)
    packed = _nibbles(blocks[:, :, 0, :], blocks[:, :, 1, :]).reshape(n, -1)
    return KernelWeights(torch.from_numpy(packed), None, scales.float().reshape(-1).contiguous(),
                         codes.to(torch.int32).sum(dim=1, dtype=torch.int32), k)


def pack_24(codes: torch.Tensor, scales: torch.Tensor) -> KernelWeights:
    """Codes [N, K] with at most 2 non-zeros in every group of 4 columns → values + 2-bit column metadata."""
    _check_codes(codes)
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


# ---------------------------------------------------------------------------------------------- W4A16 (weight-only)
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
    _check_codes(codes)
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


class PackedInt4Linear(torch.nn.Module):
    """Drop-in nn.Linear over packed INT4 weights. a_bits 2..8: quantises each token's activations and runs the
    W4A8/W4A4 integer kernel (output = the fake-quant linear up to float rounding); a_bits 16: the W4A16 weight-only
    kernel in the activations' dtype. The weights are buffers laid out once at construction; `.to(device)` moves
    them once, and every call runs the op of the device they live on (no per-call moves, no device checks)."""

    def __init__(self, weights: KernelWeights | W4A16Weights, bias: torch.Tensor | None = None, a_bits: int = 8):
        super().__init__()
        if a_bits != 16 and not 2 <= a_bits <= 8:
            raise BadInputError(f"a_bits must be 2..8 (W4A8/W4A4) or 16 (W4A16), got {a_bits}")
        if (a_bits == 16) != isinstance(weights, W4A16Weights):
            raise BadInputError("a_bits=16 needs w4a16_layout weights, a_bits <= 8 the integer kernels' layout")
        self.a_bits = a_bits
        self.in_features = weights.in_features
        self.out_features = weights.scales.numel()
        self.register_buffer("packed", weights.packed)
        self.register_buffer("meta", weights.meta)
        self.register_buffer("scales", weights.scales)
        self.register_buffer("rowsum", getattr(weights, "rowsum", None))
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())

    @property
    def weights(self) -> KernelWeights | W4A16Weights:
        if self.a_bits == 16:
            return W4A16Weights(self.packed, self.scales, self.in_features, self.out_features)
        return KernelWeights(self.packed, self.meta, self.scales, self.rowsum, self.in_features)

    @classmethod
    def from_codes(cls, codes: torch.Tensor, scales: torch.Tensor, bias=None, a_bits: int = 8, sparse: str = "auto"):
        if a_bits == 16:
            return cls(w4a16_layout(codes, scales), bias, a_bits)
        return cls(to_kernel_layout(codes, scales, sparse), bias, a_bits)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        if self.a_bits == 16:
            y = w4a16_gemm(flat, self.weights)
        else:
            xq, scale = quantize_activations(flat, self.a_bits)
            y = int4_gemm(xq, scale, self.weights)
        if self.bias is not None:
            y = y.float() + self.bias
        return y.to(x.dtype).reshape(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        kind = "w4a16" if self.a_bits == 16 else ("2:4" if self.weights.sparse else "dense")
        return f"in={self.in_features}, out={self.out_features}, int4 {kind}, a_bits={self.a_bits}"


def s4_layout(codes: torch.Tensor, multiple: int = 64) -> torch.Tensor:
    """Codes [R, K] in [-8, 7] → signed two's-complement nibbles [R, Kp/2] (low nibble = lower column), Kp a multiple
    of 64: the operand layout of `int4_gemm_s4` (activations and weights alike)."""
    rows, k = codes.shape
    kp = -(-k // multiple) * multiple
    full = torch.zeros(rows, kp, dtype=torch.int16, device=codes.device)
    full[:, :k] = codes.to(torch.int16)
    nibbles = (full & 0x0F).to(torch.uint8)
    return (nibbles[:, 0::2] | (nibbles[:, 1::2] << 4)).contiguous()
