"""Packed INT4 GEMM (W4A8 / W4A4, dense and 2:4 sparse): compiled `torch.ops.iclrkit.int4_gemm[_24]` when built,
else a pure-torch reference with the same integer accumulation.

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
from toolkit.ops import has_op

BLOCK = 128


def padded(k: int) -> int:
    return -(-k // BLOCK) * BLOCK


def quantize_activations(x: torch.Tensor, bits: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token symmetric codes (int8 storage) and float32 scales; an all-zero token gets scale 1."""
    if not 2 <= bits <= 8:
        raise BadInputError(f"activation bits must be in [2, 8], got {bits}")
    top = 2 ** (bits - 1) - 1
    x = x.float()
    amax = x.abs().amax(dim=-1)
    scale = torch.where(amax > 0, amax / top, torch.ones_like(amax))
    codes = torch.clamp(torch.round(x / scale.unsqueeze(-1)), -top, top).to(torch.int8)
    return codes, scale.float()


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


def codes_from_packed(tensors: dict[str, np.ndarray], shape: tuple[int, int], bits: int) -> torch.Tensor:
    """Integer codes [N, K] of one linear stored by toolkit.compress.packed (bitmask or dense nibble stream)."""
    from toolkit.compress.packed import unpack_linear_codes

    if bits > 4:
        raise BadInputError(f"INT4 kernels need ≤ 4-bit weights, the packed model has {bits}")
    return torch.from_numpy(unpack_linear_codes(tensors, shape, bits).astype(np.int16))


def to_kernel_layout(codes: torch.Tensor, scales: torch.Tensor, sparse: str = "auto") -> KernelWeights:
    """sparse: "auto" (2:4 kernel when the codes are 2:4), "24" (required) or "dense"."""
    if sparse not in ("auto", "24", "dense"):
        raise BadInputError(f"sparse must be auto|24|dense, got {sparse!r}")
    if sparse == "24" or (sparse == "auto" and is_24_sparse(codes)):
        return pack_24(codes, scales)
    return pack_dense(codes, scales)


def unpack_kernel_codes(weights: KernelWeights) -> torch.Tensor:
    """Inverse of pack_dense / pack_24: the codes [N, K] (used by the reference and the tests)."""
    n, k = weights.scales.numel(), weights.in_features
    raw = weights.packed.numpy()
    low = (raw & 0x0F).astype(np.int16) - 8
    high = (raw >> 4).astype(np.int16) - 8
    if not weights.sparse:
        full = np.stack([low.reshape(n, -1, 64), high.reshape(n, -1, 64)], axis=2).reshape(n, -1)
        return torch.from_numpy(full[:, :k].copy())
    values = np.concatenate([low.reshape(n, -1, 32), high.reshape(n, -1, 32)], axis=2).reshape(n, -1, 2)
    meta = weights.meta.numpy()
    fields = np.stack([(meta >> s) & 3 for s in (0, 2, 4, 6)], axis=-1).reshape(n, -1, 2).astype(np.int64)
    groups = np.zeros((n, values.shape[1], 4), dtype=np.int16)
    np.put_along_axis(groups, fields, values, axis=-1)
    return torch.from_numpy(groups.reshape(n, -1)[:, :k].copy())


def int4_gemm_reference(xq: torch.Tensor, x_scale: torch.Tensor, weights: KernelWeights) -> torch.Tensor:
    """Integer accumulation in int64 (exact), then the same float rounding order as the kernels."""
    codes = unpack_kernel_codes(weights).to(torch.int64)
    acc = (xq.to(torch.int64).unsqueeze(1) * codes.unsqueeze(0)).sum(-1).to(torch.int32)
    return acc.float() * x_scale.float().unsqueeze(1) * weights.scales.unsqueeze(0)


def int4_gemm(xq: torch.Tensor, x_scale: torch.Tensor, weights: KernelWeights, path: str = "auto") -> torch.Tensor:
    """y [M, N] = dequantised (xq · wqᵀ); path auto|scalar|avx2|vnni picks the compiled kernel's code path."""
    if xq.dim() != 2 or xq.shape[1] != weights.in_features:
        raise BadInputError(f"activations {tuple(xq.shape)} do not match {weights.in_features} input features")
    name = "int4_gemm_24" if weights.sparse else "int4_gemm"
    if xq.device.type != "cpu" or not has_op(name):
        return int4_gemm_reference(xq, x_scale, weights)
    args = (xq.to(torch.int8), x_scale.float())
    if weights.sparse:
        return torch.ops.iclrkit.int4_gemm_24(*args, weights.packed, weights.meta, weights.scales, weights.rowsum,
                                              weights.in_features, path)
    return torch.ops.iclrkit.int4_gemm(*args, weights.packed, weights.scales, weights.rowsum, weights.in_features,
                                       path)


class PackedInt4Linear(torch.nn.Module):
    """Drop-in nn.Linear over packed INT4 weights: quantises each token's activations (a_bits) and runs the kernel.

    The output equals the fake-quant linear (dequantised weights, fake-quantised activations) up to float rounding.
    """

    def __init__(self, weights: KernelWeights, bias: torch.Tensor | None = None, a_bits: int = 8):
        super().__init__()
        self.weights = weights
        self.a_bits = a_bits
        self.in_features, self.out_features = weights.in_features, weights.scales.numel()
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())

    @classmethod
    def from_codes(cls, codes: torch.Tensor, scales: torch.Tensor, bias=None, a_bits: int = 8, sparse: str = "auto"):
        return cls(to_kernel_layout(codes, scales, sparse), bias, a_bits)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        xq, scale = quantize_activations(x.reshape(-1, shape[-1]), self.a_bits)
        y = int4_gemm(xq, scale, self.weights)
        if self.bias is not None:
            y = y + self.bias
        return y.to(x.dtype).reshape(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        kind = "2:4" if self.weights.sparse else "dense"
        return f"in={self.in_features}, out={self.out_features}, int4 {kind}, a_bits={self.a_bits}"


def load_packed_int4(directory, a_bits: int = 8, sparse: str = "auto", with_tokenizer: bool = True):
    """A `compress obr` packed directory as a model whose quantized linears are PackedInt4Linear (CPU kernels).

    Rotations and the rest come from toolkit.compress.packed.load_packed; only the quantized linears are swapped.
    """
    from toolkit.compress.packed import load_packed, read_packed

    config, tensors = read_packed(directory)
    model, tokenizer = load_packed(directory, dtype=torch.float32, with_tokenizer=with_tokenizer)
    for path, shape in config["linears"].items():
        parts = {key: tensors[f"{path}.{key}"] for key in ("qweight", "scales", "mask") if f"{path}.{key}" in tensors}
        codes = codes_from_packed(parts, tuple(shape), config["bits"])
        module = model.get_submodule(path)
        bias = getattr(module, "bias", None)
        replacement = PackedInt4Linear.from_codes(codes, torch.from_numpy(parts["scales"].copy()), bias, a_bits, sparse)
        # keep the online rotation (a forward pre-hook on down_proj) that load_packed installed
        replacement._forward_pre_hooks.update(module._forward_pre_hooks)
        if hasattr(module, "iclrkit_online_rotation"):
            replacement.iclrkit_online_rotation = module.iclrkit_online_rotation
        parent_path, _, leaf = path.rpartition(".")
        setattr(model.get_submodule(parent_path) if parent_path else model, leaf, replacement)
    return model, tokenizer


def cuda_dense_layout(codes: torch.Tensor, multiple: int = 64) -> torch.Tensor:
    """Codes [R, K] → signed two's-complement nibbles [R, Kp/2] (low nibble = lower column), Kp a multiple of 64:
    the operand layout of the W4A4 mma.sync m16n8k64 kernel (activations and weights alike)."""
    rows, k = codes.shape
    kp = -(-k // multiple) * multiple
    full = torch.zeros(rows, kp, dtype=torch.int16)
    full[:, :k] = codes.to(torch.int16)
    nibbles = (full & 0x0F).to(torch.uint8)
    return (nibbles[:, 0::2] | (nibbles[:, 1::2] << 4)).contiguous()


def cuda_24_layout(weights: KernelWeights) -> tuple[torch.Tensor, torch.Tensor]:
    """The CPU 2:4 layout → the mma.sp kernel's: kept codes as sequential signed nibbles, same 2-bit metadata."""
    if not weights.sparse:
        raise BadInputError("cuda_24_layout needs 2:4 kernel weights")
    n = weights.scales.numel()
    raw = weights.packed.numpy()
    kept = np.concatenate([(raw & 0x0F).reshape(n, -1, 32), (raw >> 4).reshape(n, -1, 32)], axis=2).reshape(n, -1)
    signed = torch.from_numpy(kept.astype(np.int16) - 8)
    return cuda_dense_layout(signed, multiple=2), weights.meta
