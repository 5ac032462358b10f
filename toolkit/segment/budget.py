"""MBU-Net's cost-aware mask allocation: bit-ops per layer, the budgeted choice of per-layer mask ratios,
and the probe that measures each layer's gain from a mask ratio.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from toolkit.segment.mbunet import UNet


@torch.no_grad()
def zero_fractions(model: UNet) -> dict[str, float]:
    """Share of zero weights in each masked layer as trained (the threshold rule lets it drift from the factor)."""
    return {name: float((block.integer_weight()[0] == 0).float().mean())
            for name, block in model.quant_blocks().items() if block.mask_ratio > 0}


def layer_bitops(model: UNet, size: int) -> dict[str, int]:
    """Binary bit-operations per image for each quantized block at input size x size: H·W·Cin·Cout·9 (one plane);
    a masked (ternary) layer costs twice this (two planes)."""
    costs: dict[str, int] = {}
    hooks = [block.register_forward_hook(
        lambda m, inp, out, name=name: costs.__setitem__(name, out.shape[2] * out.shape[3] * m.conv.in_channels
                                                        * m.conv.out_channels * 9))
        for name, block in model.quant_blocks().items()]
    was_training = model.training
    try:
        model.eval()
        with torch.no_grad():
            model(torch.zeros(1, 3, size, size))
    finally:
        for h in hooks:
            h.remove()
        model.train(was_training)
    return costs


def total_bitops(costs: dict[str, int], ratios: dict[str, float]) -> int:
    return sum(cost * (2 if ratios.get(name, 0.0) > 0 else 1) for name, cost in costs.items())


def choose_mask_ratios(gains: dict[str, dict[float, float]], costs: dict[str, int], budget: float) -> dict[str, float]:
    """Cost-aware greedy masking: per layer keep the candidate ratio with the largest accuracy gain, then enable
    layers in order of gain per extra bit-op (the layer's binary cost: a masked layer doubles it) while the gain is
    positive and the extra cost stays within budget x the all-binary network's bit-ops."""
    allowed = budget * sum(costs.values())
    best = {name: max(options.items(), key=lambda kv: kv[1]) for name, options in gains.items() if options}
    order = sorted(best, key=lambda name: best[name][1] / costs[name], reverse=True)
    chosen, spent = {name: 0.0 for name in costs}, 0
    for name in order:
        ratio, gain = best[name]
        if gain > 0 and spent + costs[name] <= allowed:
            chosen[name] = ratio
            spent += costs[name]
    return chosen


def uniform_gains(costs: dict[str, int], ratio: float) -> dict[str, dict[float, float]]:
    """The paper's observation that quantization sensitivity is uniform across layers, as gains for
    `choose_mask_ratios`: every layer gains the same from its mask, so accuracy per cost ranks the cheapest layers
    first (the decoder's wide fuse/up convs last)."""
    return {name: {ratio: 1.0} for name in costs}


@torch.no_grad()
def probe_mask_gains(model: UNet, images: torch.Tensor, masks: torch.Tensor,
                     candidates: list[float]) -> dict[str, dict[float, float]]:
    """Loss decrease on a probe batch when one layer alone gets each candidate mask ratio (others as they are).
    BatchNorm uses the probe batch's statistics (momentum 0 keeps the running ones untouched), so a layer's new
    weight distribution is normalised as training would."""
    bns = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    momenta = [bn.momentum for bn in bns]
    was_training = model.training
    model.train()
    for bn in bns:
        bn.momentum = 0.0
    try:
        base_ratios = model.mask_ratios()
        loss = lambda: F.cross_entropy(model(images), masks).item()
        base = loss()
        gains: dict[str, dict[float, float]] = {}
        for name, block in model.quant_blocks().items():
            gains[name] = {}
            for ratio in candidates:
                block.mask_ratio = ratio
                gains[name][ratio] = base - loss()
            block.mask_ratio = base_ratios[name]
    finally:
        for bn, momentum in zip(bns, momenta):
            bn.momentum = momentum
        model.train(was_training)
    return gains
