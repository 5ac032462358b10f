"""Layer-wise relevance propagation (LRP, Bach et al. 2015; rules as in Montavon et al., "Layer-wise relevance
propagation: an overview", 2019) through a plain Conv2d / BatchNorm2d / ReLU stack such as the CAVE backbone.

Own implementation, checked in tests/unit/test_lrp.py against `zennit` (Anders et al., PyPI `zennit`: its rules
`Epsilon`, `ZPlus`, `ZBox` with the `SequentialMergeBatchNorm` canonizer) when that package can be imported; the
library itself does not depend on it (zennit imports torchvision at import time, which this project does not ship).

For a layer z_k = sum_j x_j w_jk (+ b_k) with upper relevance R_k, every rule is R_j = x'_j * sum_k w'_jk R_k / z'_k
for a modified input x' and weight w' (computed here as a transposed convolution, `torch.nn.grad.conv2d_input`):
  * epsilon: w' = w, z' = z + eps * sign(z) (bias dropped from z unless keep_bias; with it dropped the rule is
    conservative, sum_j R_j = sum_k R_k, up to eps);
  * zplus: w' = max(w, 0) on non-negative inputs (the ReLU outputs), bias dropped: conservative;
  * zbox: inputs boxed in [low, high]: R_j = x_j c_j - low c+_j - high c-_j with z' = z - low w+ - high w- (the bias
    cancels): conservative, the rule for the pixel layer.
BatchNorm (eval statistics) is folded into the preceding conv, ReLU passes relevance through unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from toolkit.core.errors import require

Rule = Literal["epsilon", "zplus", "zbox"]


@dataclass
class FoldedConv:
    weight: torch.Tensor
    bias: torch.Tensor
    stride: tuple[int, int]
    padding: tuple[int, int]
    relu_after: bool


def fold_sequential(net: nn.Sequential) -> list[FoldedConv]:
    """Conv2d [BatchNorm2d] [ReLU] groups of `net` as convs with the BatchNorm's eval statistics folded in."""
    layers = list(net)
    out: list[FoldedConv] = []
    i = 0
    while i < len(layers):
        conv = layers[i]
        require(isinstance(conv, nn.Conv2d), f"LRP: expected Conv2d at position {i}, got {type(conv).__name__}")
        require(conv.groups == 1 and conv.dilation == (1, 1), "LRP: grouped or dilated convs are not supported")
        weight = conv.weight.detach()
        bias = conv.bias.detach() if conv.bias is not None else torch.zeros(conv.out_channels)
        i += 1
        if i < len(layers) and isinstance(layers[i], nn.BatchNorm2d):
            bn = layers[i]
            scale = bn.weight.detach() / torch.sqrt(bn.running_var + bn.eps)
            weight = weight * scale[:, None, None, None]
            bias = (bias - bn.running_mean) * scale + bn.bias.detach()
            i += 1
        relu = i < len(layers) and isinstance(layers[i], nn.ReLU)
        i += relu
        out.append(FoldedConv(weight, bias, conv.stride, conv.padding, relu))
    return out


def stabilize(z: torch.Tensor, eps: float) -> torch.Tensor:
    """z + eps * sign(z), sign(0) = +1 (zennit's convention)."""
    return z + eps * torch.where(z >= 0, 1.0, -1.0)


def _conv(x, weight, layer, bias=None):
    return F.conv2d(x, weight, bias, layer.stride, layer.padding)


def _back(x_shape, weight, layer, s):
    return torch.nn.grad.conv2d_input(x_shape, weight, s, layer.stride, layer.padding)


def lrp_layer(x: torch.Tensor, layer: FoldedConv, relevance: torch.Tensor, rule: Rule, eps: float = 1e-6,
              low: float = 0.0, high: float = 1.0, keep_bias: bool = False) -> torch.Tensor:
    """Relevance of the layer input x (B, C, H, W) from the output relevance (B, K, C', H', W') of K explained
    quantities per image (K backward passes in one)."""
    b, k = relevance.shape[:2]
    flat = relevance.reshape(b * k, *relevance.shape[2:])

    def spread(weight, z):
        s = (flat.reshape(b, k, *z.shape[1:]) / z[:, None]).reshape(b * k, *z.shape[1:])
        return _back((b * k, *x.shape[1:]), weight, layer, s).reshape(b, k, *x.shape[1:])

    if rule == "epsilon":
        z = stabilize(_conv(x, layer.weight, layer, layer.bias if keep_bias else None), eps)
        return x[:, None] * spread(layer.weight, z)
    if rule == "zplus":
        xp, wp = x.clamp(min=0), layer.weight.clamp(min=0)
        z = stabilize(_conv(xp, wp, layer), eps)
        return xp[:, None] * spread(wp, z)
    if rule == "zbox":
        wp, wn = layer.weight.clamp(min=0), layer.weight.clamp(max=0)
        lo, hi = torch.full_like(x, low), torch.full_like(x, high)
        z = stabilize(_conv(x, layer.weight, layer) - _conv(lo, wp, layer) - _conv(hi, wn, layer), eps)
        s = (flat.reshape(b, k, *z.shape[1:]) / z[:, None]).reshape(b * k, *z.shape[1:])
        shape = (b * k, *x.shape[1:])
        c, cp, cn = (_back(shape, w, layer, s).reshape(b, k, *x.shape[1:]) for w in (layer.weight, wp, wn))
        return x[:, None] * c - lo[:, None] * cp - hi[:, None] * cn
    raise ValueError(f"unknown LRP rule {rule!r}")


def default_rules(n_layers: int, top: Rule = "epsilon") -> list[Rule]:
    """zbox on the pixel layer, zplus in between, `top` on the last conv (an "EpsilonPlusBox"-style composite)."""
    if n_layers == 1:
        return ["zbox"]
    return ["zbox", *["zplus"] * (n_layers - 2), top]


def forward_inputs(layers: list[FoldedConv], x: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Each folded layer's input and the stack's output (equal to the module's eval forward)."""
    inputs = []
    for layer in layers:
        inputs.append(x)
        x = _conv(x, layer.weight, layer, layer.bias)
        if layer.relu_after:
            x = F.relu(x)
    return inputs, x


def lrp_backward(layers: list[FoldedConv], inputs: list[torch.Tensor], relevance: torch.Tensor,
                 rules: list[Rule], eps: float = 1e-6, low: float = 0.0, high: float = 1.0) -> torch.Tensor:
    """Input relevance (B, K, C, H, W) from the output relevance (B, K, d, h, w), layer by layer."""
    require(len(rules) == len(layers), f"{len(rules)} rules for {len(layers)} layers")
    for layer, x, rule in zip(reversed(layers), reversed(inputs), reversed(rules)):
        relevance = lrp_layer(x, layer, relevance, rule, eps, low, high)
    return relevance


def nov_feature_relevance(features: torch.Tensor, concepts: torch.Tensor, relevance: torch.Tensor,
                          eps: float = 1e-6) -> torch.Tensor:
    """CAVE's NOV-aware rule at the matching layer: the relevance R(i, h) of cell i for concept h (B, D, h, w) is
    shared among the d channels of the unit-norm feature f_i in proportion to f_i * h (channel-wise product),
    R(i, h, c) = R(i, h) (f_ic h_c) / sum_c' f_ic' h_c' (the denominator is cos(f_i, h)); (B, D, d, h, w), summing
    over c to R(i, h). concepts (B, D, d): each image's explained concepts. The normalisation f = z / ||z|| is a
    per-cell positive scale, through which LRP passes relevance unchanged, so this is also the relevance of z."""
    prod = features[:, None] * concepts[:, :, :, None, None]  # (B, D, d, h, w)
    return relevance[:, :, None] * prod / stabilize(prod.sum(2, keepdim=True), eps)
