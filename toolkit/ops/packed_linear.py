"""`PackedInt4Linear`: a drop-in nn.Linear over packed INT4 weights, running the integer kernels of
toolkit.ops.int4 (W4A8 / W4A4) or the weight-only kernel of toolkit.ops.w4a16 (W4A16)."""

from __future__ import annotations

import torch

from toolkit.core.errors import BadInputError
from toolkit.ops.int4 import KernelWeights, int4_gemm, quantize_activations, to_kernel_layout
from toolkit.ops.w4a16 import W4A16Weights, w4a16_gemm, w4a16_layout


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
