"""Weights laid out for the device once, at load: `ternary_prepack` (one op, CPU and CUDA kernels, the pure-torch
reference elsewhere) turns a layer's planes and thresholds into the layout the device's conv kernel reads, and
`ternary_conv2d_prepacked` / `ternary_conv2d_sign_prepacked` take that layout as it is, so a call re-lays nothing.
The raw-plane ops and the bit layout itself are in toolkit.segment.kernels.

Imports only torch (and toolkit.ops.registry, toolkit.segment.kernels), like kernels.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from toolkit.ops import registry
from toolkit.segment.kernels import WORD, _conv_op_reference, _shifts, pack_bool, threshold_bits

INT64_MAX = 2 ** 63 - 1
CPU_CHANNELS = 8  # the CPU kernel pads output channels to a multiple of 8 (its narrowest vector block)
CUDA_CHANNELS = 32  # the CUDA kernel pads them to whole 32-channel warp tiles


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _popcount(words: torch.Tensor) -> torch.Tensor:
    """Set bits per int64 word (pure torch, any device)."""
    return ((words.unsqueeze(-1) >> _shifts(words.device)) & 1).sum(-1)


def _prepack_reference(pos, neg, threshold, flip):
    """The CPU kernel's layout, in pure torch (csrc/binary/ternary_conv.cpp builds the same tensors):
    planes int64 [kh, kw, words, O_pad] (output channel fastest), tap constants popc(pos) - popc(neg) int64
    [kh, kw, O_pad], thresholds int64 [O_pad] (padding channels INT64_MAX: their bits stay 0) and the flips as a
    uint8 bit mask [O_pad / 8]; O_pad = O rounded up to 8."""
    out_ch, kh, kw, words = pos.shape
    o_pad = _round_up(out_ch, CPU_CHANNELS)

    def taps(planes):
        laid = torch.zeros(kh, kw, words, o_pad, dtype=torch.int64, device=planes.device)
        laid[..., :out_ch] = planes.permute(1, 2, 3, 0)
        return laid

    p, q = taps(pos), taps(neg)
    tap_c = (_popcount(p) - _popcount(q)).sum(2)
    thr = torch.full((o_pad,), INT64_MAX, dtype=torch.int64, device=pos.device)
    thr[:out_ch] = threshold.reshape(-1).to(torch.int64)
    bits = torch.zeros(o_pad, dtype=torch.int64, device=pos.device)
    bits[:out_ch] = flip.reshape(-1).to(torch.int64) != 0
    flip_bits = (bits.view(-1, 8) << torch.arange(8, device=pos.device)).sum(-1).to(torch.uint8)
    return p, q, tap_c, thr, flip_bits


def _kernel_layout(device: torch.device) -> str:
    """The layout `ternary_prepack` builds on `device`: "bmma" (the CUDA kernel's 128-bit Tensor Core columns) where a
    compiled CUDA kernel serves the device, else "words" (the CPU kernel's, also what the reference builds). The
    layout is the device kernel's own by design (as torchao's packed INT4 layouts are), so the fake names it."""
    key = device.type.upper()
    return "bmma" if key == "CUDA" and registry.has_kernel("ternary_prepack", key) else "words"


def _prepack_fake(pos, neg, threshold, flip):
    out_ch, kh, kw, words = pos.shape
    if _kernel_layout(pos.device) == "bmma":
        o_pad = _round_up(out_ch, CUDA_CHANNELS)
        planes = (kh, kw, -(-words // 2), o_pad, 4)
        return (pos.new_empty(planes, dtype=torch.int32), pos.new_empty(planes, dtype=torch.int32),
                pos.new_empty((kh, kw, o_pad), dtype=torch.int32), pos.new_empty((out_ch,), dtype=torch.int64),
                pos.new_empty((out_ch,), dtype=torch.bool))
    o_pad = _round_up(out_ch, CPU_CHANNELS)
    return (pos.new_empty((kh, kw, words, o_pad)), pos.new_empty((kh, kw, words, o_pad)),
            pos.new_empty((kh, kw, o_pad)), pos.new_empty((o_pad,)), pos.new_empty((o_pad // 8,), dtype=torch.uint8))


def _planes_from_prepacked(laid: torch.Tensor, out_ch: int, words: int) -> torch.Tensor:
    """Either prepacked plane layout -> the raw plane int64 [O, kh, kw, words] (pure torch, on its device)."""
    if laid.dim() == 5:  # CUDA: int32 [kh, kw, KC, O_pad, 4], one 128-bit column per output channel
        kh, kw, chunks, o_pad, _ = laid.shape
        planes = laid.permute(3, 0, 1, 2, 4).contiguous().view(torch.int64).reshape(o_pad, kh, kw, 2 * chunks)
        return planes[:out_ch, ..., :words]
    return laid.permute(3, 0, 1, 2)[:out_ch]  # CPU: int64 [kh, kw, words, O_pad]


def _threshold_from_prepacked(threshold: torch.Tensor, flip: torch.Tensor, out_ch: int):
    if flip.dtype == torch.bool:  # CUDA: int64 [O], bool [O]
        return threshold[:out_ch], flip[:out_ch]
    bits = (flip.to(torch.int64).unsqueeze(-1) >> torch.arange(8, device=flip.device)) & 1  # CPU: uint8 bit mask
    return threshold[:out_ch], bits.reshape(-1)[:out_ch].bool()


def _prepacked_op_reference(x, pos, neg, tap_c, out_channels, stride, padding, binary, impl):
    """Float64 conv2d of the unpacked operands (the tap constants are not used: the reference needs none)."""
    words = x.shape[-1]
    return _conv_op_reference(x, _planes_from_prepacked(pos, out_channels, words),
                              _planes_from_prepacked(neg, out_channels, words), stride, padding, binary, impl)


def _prepacked_sign_op_reference(x, pos, neg, tap_c, threshold, flip, out_channels, stride, padding, binary, impl):
    sums = _prepacked_op_reference(x, pos, neg, tap_c, out_channels, stride, padding, binary, impl)
    return pack_bool(threshold_bits(sums, *_threshold_from_prepacked(threshold, flip, out_channels)))


def _prepacked_out(x, tap_c, stride, padding) -> tuple[int, int]:
    return ((x.shape[1] + 2 * padding - tap_c.shape[0]) // stride + 1,
            (x.shape[2] + 2 * padding - tap_c.shape[1]) // stride + 1)


def _prepacked_fake(x, pos, neg, tap_c, out_channels, stride, padding, binary, impl):
    ho, wo = _prepacked_out(x, tap_c, stride, padding)
    return x.new_empty((x.shape[0], ho, wo, out_channels), dtype=torch.int32)


def _prepacked_sign_fake(x, pos, neg, tap_c, threshold, flip, out_channels, stride, padding, binary, impl):
    ho, wo = _prepacked_out(x, tap_c, stride, padding)
    return x.new_empty((x.shape[0], ho, wo, (out_channels + WORD - 1) // WORD), dtype=torch.int64)


registry.register("ternary_prepack", "ternary_prepack(Tensor w_pos, Tensor w_neg, Tensor threshold, Tensor flip) -> "
                  "(Tensor, Tensor, Tensor, Tensor, Tensor)", _prepack_reference, _prepack_fake)
registry.register("ternary_conv2d_prepacked", "ternary_conv2d_prepacked(Tensor x, Tensor w_pos, Tensor w_neg, "
                  "Tensor tap_c, int out_channels, int stride, int padding, bool binary, int impl) -> Tensor",
                  _prepacked_op_reference, _prepacked_fake)
registry.register("ternary_conv2d_sign_prepacked", "ternary_conv2d_sign_prepacked(Tensor x, Tensor w_pos, "
                  "Tensor w_neg, Tensor tap_c, Tensor threshold, Tensor flip, int out_channels, int stride, "
                  "int padding, bool binary, int impl) -> Tensor", _prepacked_sign_op_reference, _prepacked_sign_fake)


@dataclass(frozen=True)
class PrepackedWeights:
    """One layer's weights in the conv kernel's layout for the device they were prepacked on (`ternary_prepack`):
    built once at load, read as they are by every call. The layout is that device kernel's own (CPU: int64 words,
    output channel fastest; CUDA: 128-bit BMMA columns), so a layer moved to another device prepacks its raw planes
    again there (toolkit.segment.packed.PackedLayer.to) rather than moving these tensors."""

    pos: torch.Tensor
    neg: torch.Tensor
    tap_c: torch.Tensor
    threshold: torch.Tensor
    flip: torch.Tensor
    out_channels: int
    words: int  # activation words per pixel the layer reads

    def planes(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Inverse of the prepack (pure torch, on the layout's device): (pos, neg, threshold, flip) as given to it."""
        pos = _planes_from_prepacked(self.pos, self.out_channels, self.words)
        neg = _planes_from_prepacked(self.neg, self.out_channels, self.words)
        return (pos, neg, *_threshold_from_prepacked(self.threshold, self.flip, self.out_channels))


def ternary_prepack(pos: torch.Tensor, neg: torch.Tensor, threshold: torch.Tensor | None = None,
                    flip: torch.Tensor | None = None) -> PrepackedWeights:
    """Planes int64 [O, kh, kw, words] (+ per-channel threshold and flip for the fused sign op; zeros / False when
    only sums are wanted) -> the layout of the kernel that serves their device. Call once, at load."""
    out_ch = pos.shape[0]
    if threshold is None:
        threshold = torch.zeros(out_ch, dtype=torch.int64, device=pos.device)
    if flip is None:
        flip = torch.zeros(out_ch, dtype=torch.bool, device=pos.device)
    laid = torch.ops.iclrkit.ternary_prepack(pos, neg, threshold, flip)
    return PrepackedWeights(*laid, out_channels=out_ch, words=pos.shape[-1])


def ternary_conv2d_prepacked(x: torch.Tensor, weights: PrepackedWeights, stride: int = 1, padding: int = 0,
                             binary: bool = False, impl: int = 0) -> torch.Tensor:
    """Exact integer sums [N, Ho, Wo, O] (int32) on x's device, from prepacked weights (nothing re-laid per call).
    `binary` uses the one-plane form (requires neg = valid & ~pos); impl picks the CPU path (0 best, 1 scalar,
    2 AVX2, 3 AVX-512)."""
    return torch.ops.iclrkit.ternary_conv2d_prepacked(x, weights.pos, weights.neg, weights.tap_c,
                                                      weights.out_channels, stride, padding, binary, impl)


def ternary_conv2d_sign_prepacked(x: torch.Tensor, weights: PrepackedWeights, stride: int = 1, padding: int = 0,
                                  binary: bool = False, impl: int = 0) -> torch.Tensor:
    """Convolution, fused per-channel threshold (the prepacked one) and bit-packing: int64 [N, Ho, Wo, ceil(O/64)]."""
    return torch.ops.iclrkit.ternary_conv2d_sign_prepacked(x, weights.pos, weights.neg, weights.tap_c,
                                                           weights.threshold, weights.flip, weights.out_channels,
                                                           stride, padding, binary, impl)
