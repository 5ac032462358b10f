"""Bit-packed ternary/binary convolution as torch ops that dispatch on the tensors' device: `torch.ops.iclrkit.
ternary_conv2d*` / `pack_sign` run the compiled CPU kernel (AVX-512 / AVX2 popcount) or the CUDA kernel (binary Tensor
Core BMMA, AND + popcount) where `toolkit._C` has one, else the pure-torch references below (registered by
toolkit.ops.registry, with fake implementations for the meta device); plus a numpy AND+popcount reference that
mirrors the packed algorithm word by word.

Layout (channels-last, bit-packed along channels): activations int64 [N, H, W, words], bit j of word k is channel
64k + j of that pixel, 1 = +1 and 0 = -1, unused bits 0. Inputs built by channel concatenation keep each part
word-aligned ("segments"), so a concat is a word concat. Weights {-1, 0, +1} are two planes pos = [w > 0],
neg = [w < 0], int64 [O, kh, kw, words] packed with the same segments. A zero weight (pos = neg = 0), a padding
bit and an out-of-bounds tap all contribute nothing, so the integer sums equal float conv2d with zero padding.

Layers lay their weights out for the device once, at load (toolkit.segment.prepack: `ternary_prepack`,
`ternary_conv2d_prepacked`); `ternary_conv2d` / `ternary_conv2d_sign` here, on raw planes, stay as one-shot
conveniences (prepack + kernel per call).

This module imports only torch and numpy (and toolkit.ops.registry), so the GPU check can use it without the CLI's
dependencies. The wrappers carry no device checks: every tensor stays on the device it was created on.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from toolkit.ops import registry

WORD = 64


def _shifts(device: torch.device) -> torch.Tensor:
    return torch.arange(WORD, dtype=torch.int64, device=device)


def words_for(segments: Sequence[int]) -> int:
    return sum((c + WORD - 1) // WORD for c in segments)


def _segment_columns(segments: Sequence[int], device: torch.device | None = None) -> torch.Tensor:
    """Bit positions (in the word-padded layout) of each real channel, in channel order."""
    cols, base = [], 0
    for c in segments:
        cols.append(torch.arange(c, device=device) + base)
        base += (c + WORD - 1) // WORD * WORD
    return torch.cat(cols)


def pack_bool(bits: torch.Tensor, segments: Sequence[int] | None = None) -> torch.Tensor:
    """bool [..., C] (C = sum(segments)) -> int64 [..., words], each segment starting on a fresh word."""
    segments = list(segments) if segments is not None else [bits.shape[-1]]
    if sum(segments) != bits.shape[-1]:
        raise ValueError(f"segments {segments} do not add up to {bits.shape[-1]} channels")
    padded = torch.zeros(*bits.shape[:-1], words_for(segments) * WORD, dtype=torch.int64, device=bits.device)
    padded[..., _segment_columns(segments, bits.device)] = bits.to(torch.int64)
    grouped = padded.view(*bits.shape[:-1], -1, WORD) << _shifts(bits.device)  # distinct powers of two: sum = OR
    return grouped.sum(-1)


def unpack_bool(words: torch.Tensor, segments: Sequence[int]) -> torch.Tensor:
    """int64 [..., words] -> bool [..., sum(segments)]."""
    bits = (words.unsqueeze(-1) >> _shifts(words.device)) & 1
    return bits.flatten(-2)[..., _segment_columns(segments, words.device)].bool()


def pack_sign_reference(x: torch.Tensor) -> torch.Tensor:
    """float NCHW -> packed sign bits (x >= 0 is +1) [N, H, W, words]."""
    return pack_bool(x.permute(0, 2, 3, 1) >= 0)


def pack_sign(x: torch.Tensor) -> torch.Tensor:
    return torch.ops.iclrkit.pack_sign(x)


def unpack_sign(words: torch.Tensor, segments: Sequence[int]) -> torch.Tensor:
    """Packed bits -> float ±1 NCHW."""
    return (unpack_bool(words, segments).permute(0, 3, 1, 2).float() * 2 - 1).contiguous()


def weight_planes(q: torch.Tensor, segments: Sequence[int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Integer weights {-1, 0, +1} [O, C, kh, kw] -> (pos, neg) int64 [O, kh, kw, words]."""
    if not bool(((q == -1) | (q == 0) | (q == 1)).all()):
        raise ValueError("weight_planes expects weights in {-1, 0, +1}")
    channels_last = q.permute(0, 2, 3, 1)
    return pack_bool(channels_last > 0, segments), pack_bool(channels_last < 0, segments)


def planes_to_weight(pos: torch.Tensor, neg: torch.Tensor, segments: Sequence[int]) -> torch.Tensor:
    """Inverse of weight_planes: float {-1, 0, +1} [O, C, kh, kw]."""
    q = unpack_bool(pos, segments).float() - unpack_bool(neg, segments).float()
    return q.permute(0, 3, 1, 2).contiguous()


def ternary_conv2d_reference(x: torch.Tensor, pos: torch.Tensor, neg: torch.Tensor, stride: int, padding: int,
                             segments: Sequence[int]) -> torch.Tensor:
    """Float64 conv2d of the unpacked ±1 activations with the unpacked weights -> int32 [N, Ho, Wo, O]."""
    act = unpack_sign(x, segments).double()
    weight = planes_to_weight(pos, neg, segments).double()
    out = torch.nn.functional.conv2d(act, weight, stride=stride, padding=padding)
    return out.round().to(torch.int32).permute(0, 2, 3, 1).contiguous()


def threshold_bits(sums: torch.Tensor, threshold: torch.Tensor, flip: torch.Tensor) -> torch.Tensor:
    """bool [..., O]: s >= t, or s <= t where flip (negative BN scale)."""
    t = threshold.to(sums.dtype)
    return torch.where(flip.bool(), sums <= t, sums >= t)


def _conv_out(x: torch.Tensor, pos: torch.Tensor, stride: int, padding: int) -> tuple[int, int]:
    return ((x.shape[1] + 2 * padding - pos.shape[1]) // stride + 1,
            (x.shape[2] + 2 * padding - pos.shape[2]) // stride + 1)


def _conv_op_reference(x, pos, neg, stride, padding, binary, impl):
    """The op's reference: every bit of every word counts as a channel. A padding bit is 0 in the activations
    (= -1) but 0 in both weight planes (weight 0), so it adds nothing; `binary` and `impl` change nothing here."""
    return ternary_conv2d_reference(x, pos, neg, stride, padding, [pos.shape[-1] * WORD])


def _conv_sign_op_reference(x, pos, neg, threshold, flip, stride, padding, binary, impl):
    sums = _conv_op_reference(x, pos, neg, stride, padding, binary, impl)
    return pack_bool(threshold_bits(sums, threshold, flip))


def _conv_fake(x, pos, neg, stride, padding, binary, impl):
    ho, wo = _conv_out(x, pos, stride, padding)
    return x.new_empty((x.shape[0], ho, wo, pos.shape[0]), dtype=torch.int32)


def _conv_sign_fake(x, pos, neg, threshold, flip, stride, padding, binary, impl):
    ho, wo = _conv_out(x, pos, stride, padding)
    return x.new_empty((x.shape[0], ho, wo, (pos.shape[0] + WORD - 1) // WORD), dtype=torch.int64)


def _pack_sign_fake(x):
    return x.new_empty((x.shape[0], x.shape[2], x.shape[3], (x.shape[1] + WORD - 1) // WORD), dtype=torch.int64)


registry.register("ternary_conv2d", "ternary_conv2d(Tensor x, Tensor w_pos, Tensor w_neg, int stride, int padding, "
                  "bool binary, int impl) -> Tensor", _conv_op_reference, _conv_fake)
registry.register("ternary_conv2d_sign", "ternary_conv2d_sign(Tensor x, Tensor w_pos, Tensor w_neg, Tensor threshold, "
                  "Tensor flip, int stride, int padding, bool binary, int impl) -> Tensor", _conv_sign_op_reference,
                  _conv_sign_fake)
registry.register("pack_sign", "pack_sign(Tensor x) -> Tensor", pack_sign_reference, _pack_sign_fake)


def ternary_conv2d(x: torch.Tensor, pos: torch.Tensor, neg: torch.Tensor, stride: int = 1, padding: int = 0,
                   binary: bool = False, segments: Sequence[int] | None = None, impl: int = 0) -> torch.Tensor:
    """One-shot form on raw planes (re-lays them on every call; layers use `ternary_prepack` once and
    `ternary_conv2d_prepacked`). Exact integer sums [N, Ho, Wo, O] (int32) on x's device. `segments` is accepted
    for callers that know the channel layout; the op needs none (padding bits carry zero weights)."""
    return torch.ops.iclrkit.ternary_conv2d(x, pos, neg, stride, padding, binary, impl)


def ternary_conv2d_sign(x: torch.Tensor, pos: torch.Tensor, neg: torch.Tensor, threshold: torch.Tensor,
                        flip: torch.Tensor, stride: int = 1, padding: int = 0, binary: bool = False,
                        segments: Sequence[int] | None = None, impl: int = 0) -> torch.Tensor:
    """One-shot form of `ternary_conv2d_sign_prepacked` on raw planes: int64 [N, Ho, Wo, ceil(O/64)]."""
    return torch.ops.iclrkit.ternary_conv2d_sign(x, pos, neg, threshold, flip, stride, padding, binary, impl)


def maxpool_bits(x: torch.Tensor) -> torch.Tensor:
    """2x2 max-pool of ±1 activations = OR of the packed bits (floor mode, like F.max_pool2d)."""
    h, w = x.shape[1] // 2 * 2, x.shape[2] // 2 * 2
    x = x[:, :h, :w]
    return x[:, 0::2, 0::2] | x[:, 1::2, 0::2] | x[:, 0::2, 1::2] | x[:, 1::2, 1::2]


def upsample_bits(x: torch.Tensor) -> torch.Tensor:
    """Nearest-neighbour 2x upsampling of packed activations."""
    return x.repeat_interleave(2, dim=1).repeat_interleave(2, dim=2)


def ternary_conv2d_numpy(x: np.ndarray, pos: np.ndarray, neg: np.ndarray, stride: int, padding: int) -> np.ndarray:
    """The AND+popcount algorithm word by word in numpy (an independent check of the kernels):
    s = sum over in-bounds taps of 2 (popc(a & pos) - popc(a & neg)) - (popc(pos) - popc(neg))."""
    a = x.view(np.uint64)
    p, q = pos.view(np.uint64), neg.view(np.uint64)
    n_img, h, w, _ = a.shape
    o, kh, kw, _ = p.shape
    ho, wo = (h + 2 * padding - kh) // stride + 1, (w + 2 * padding - kw) // stride + 1
    out = np.zeros((n_img, ho, wo, o), dtype=np.int64)
    tap_const = (np.bitwise_count(p).astype(np.int64) - np.bitwise_count(q).astype(np.int64)).sum(-1)  # [O,kh,kw]
    for ky in range(kh):
        for kx in range(kw):
            ys = np.arange(ho) * stride - padding + ky
            xs = np.arange(wo) * stride - padding + kx
            vy, vx = (ys >= 0) & (ys < h), (xs >= 0) & (xs < w)
            if not vy.any() or not vx.any():
                continue
            patch = a[:, ys[vy]][:, :, xs[vx]]  # [N, hy, wx, words]
            hits = (np.bitwise_count(patch[..., None, :] & p[:, ky, kx]).astype(np.int64)
                    - np.bitwise_count(patch[..., None, :] & q[:, ky, kx]).astype(np.int64)).sum(-1)
            out[:, np.flatnonzero(vy)[:, None], np.flatnonzero(vx)[None, :]] += 2 * hits - tap_const[:, ky, kx]
    return out.astype(np.int32)
