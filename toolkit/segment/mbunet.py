"""MBU-Net: masked binary U-Net (weights {-1, 0, +1}·α with an explicit zero state, sign activations, STE),
cost-aware per-layer mask ratios, and the fp32 / plain-binary variants it is compared against.

Paper: Wu, Song, Kondguli, Geng, Li, "Zeros can be Informative: Masked Binary U-Net for Image Segmentation on
Tensor Cores", ICLR 2026, https://arxiv.org/abs/2601.11660. Official code (an inference harness on random weights,
no training): https://github.com/ChunshuWu/MBU-Net.

Network: U-Net with 3x3 convs, 2x2 max-pool, nearest 2x upsampling followed by a 3x3 conv (instead of the
paper's 2x2 transposed conv: it keeps every binary layer a plain 3x3 conv on packed bits), and channel
concatenation of the skips. The first conv (RGB in) and the last 1x1 conv (logits out) stay full precision; every
other conv is quantized and followed by BatchNorm and a sign activation, so at conversion BN folds into one integer
threshold per channel (`toolkit.segment.packed`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import nn

from toolkit.core.config import BaseConfig
from toolkit.core.errors import BadInputError, RunError

VARIANTS = ("masked", "binary", "fp32")
ARCH_FILE = "mbunet.json"
WEIGHTS_FILE = "model.safetensors"


class SignSTE(torch.autograd.Function):
    """sign(x) with sign(0) = +1; straight-through gradient clipped to |x| <= 1 (BNN convention)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.where(x >= 0, torch.ones_like(x), -torch.ones_like(x))

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * (x.abs() <= 1).to(grad.dtype)


def sign(x: torch.Tensor) -> torch.Tensor:
    return torch.where(x >= 0, torch.ones_like(x), -torch.ones_like(x))


MASK_RULES = ("ratio", "threshold")


def keep_mask(w: torch.Tensor, mask: float, rule: str = "ratio") -> torch.Tensor:
    """Weights that stay non-zero, per output channel (dim 0). `mask` 0 keeps all (plain binary).
    ratio: the floor(mask * fan_in) smallest-|w| weights of each channel are zeroed (a fixed zero fraction).
    threshold: TWN rule |w| > mask * mean|w| of the channel (mask 0.7 is TWN's Delta), so each channel's sparsity
    follows its latent weights and can grow during training."""
    flat = w.detach().abs().flatten(1)
    if mask == 0:
        return torch.ones_like(w, dtype=torch.bool)
    if rule == "threshold":
        return (flat > mask * flat.mean(1, keepdim=True)).view_as(w)
    k = int(mask * flat.shape[1])
    if k == 0:
        return torch.ones_like(w, dtype=torch.bool)
    delta = flat.kthvalue(k, dim=1, keepdim=True).values
    return (flat > delta).view_as(w)


def quantize_weight(w: torch.Tensor, mask: float, rule: str = "ratio") -> tuple[torch.Tensor, torch.Tensor]:
    """(q, alpha): q = sign(w) in {-1, +1} where `keep_mask` keeps the weight, 0 elsewhere; alpha[o] = mean |w|
    over the kept weights of channel o (TWN / XNOR-Net per-channel scale)."""
    keep = keep_mask(w, mask, rule)
    q = torch.where(w >= 0, 1.0, -1.0).to(w.dtype) * keep
    alpha = (w.abs() * keep).flatten(1).sum(1) / keep.flatten(1).sum(1).clamp_min(1)
    return q, alpha


def bn_affine(s: torch.Tensor, alpha: torch.Tensor, bn: nn.BatchNorm2d) -> torch.Tensor:
    """Eval-mode BN of alpha·s with channels on dim 1. The same elementwise float ops run in the model's eval
    forward and in threshold folding, which is what makes the conversion exact."""
    shape = (-1,) + (1,) * (s.dim() - 2)
    scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)
    return (s * alpha.view(shape) - bn.running_mean.view(shape)) * scale.view(shape) + bn.bias.view(shape)


class QuantBlock(nn.Module):
    """3x3 conv (no bias) -> BatchNorm -> activation. Quantized: weights q·alpha (STE), sign activation, inputs ±1.
    Float (fp32 variant): plain conv -> BN -> ReLU. `segments` records the channel groups of a concatenated input."""

    def __init__(self, cin: int, cout: int, quantized: bool, segments: list[int] | None = None):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(cout)
        self.quantized = quantized
        self.mask_ratio = 0.0
        self.mask_rule = "ratio"
        self.segments = segments or [cin]

    def integer_weight(self) -> tuple[torch.Tensor, torch.Tensor]:
        return quantize_weight(self.conv.weight, self.mask_ratio, self.mask_rule)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.quantized:
            return F.relu(self.bn(self.conv(x)))
        w = self.conv.weight
        q, alpha = self.integer_weight()
        if not self.training:
            s = F.conv2d(x, q, padding=1).round()  # exact integers whatever algorithm conv2d picks
            return sign(bn_affine(s, alpha.detach(), self.bn))
        scale = alpha.detach().view(-1, 1, 1, 1)
        q_ste = w / scale + (q - w / scale).detach()
        return SignSTE.apply(self.bn(F.conv2d(x, q_ste, padding=1) * alpha.view(1, -1, 1, 1)))


class StemBlock(nn.Module):
    """Full-precision first conv (RGB in) -> BN -> sign (binary variants) or ReLU (fp32)."""

    def __init__(self, cout: int, binary_out: bool):
        super().__init__()
        self.conv = nn.Conv2d(3, cout, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(cout)
        self.binary_out = binary_out

    def pre_activation(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.conv(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.pre_activation(x)
        if not self.binary_out:
            return F.relu(y)
        return SignSTE.apply(y) if self.training else sign(y)


class UNet(nn.Module):
    """U-Net of `depth` down/up levels with channels width·2^i. Quantized blocks are named enc{i}.{j}, up{i},
    fuse{i}; their `mask_ratio` is 0 (binary) unless cost-aware masking gives them zeros."""

    def __init__(self, width: int = 16, depth: int = 3, num_classes: int = 4, variant: str = "masked",
                 mask_rule: str = "ratio"):
        super().__init__()
        if variant not in VARIANTS:
            raise BadInputError(f"unknown variant '{variant}'", f"use one of {', '.join(VARIANTS)}")
        if mask_rule not in MASK_RULES:
            raise BadInputError(f"unknown mask rule '{mask_rule}'", f"use one of {', '.join(MASK_RULES)}")
        self.width, self.depth, self.num_classes, self.variant = width, depth, num_classes, variant
        self.mask_rule = mask_rule
        quant = variant != "fp32"
        ch = [width * 2**i for i in range(depth + 1)]
        self.stem = StemBlock(ch[0], binary_out=quant)
        self.enc = nn.ModuleList()
        for i in range(depth + 1):
            cin = ch[0] if i == 0 else ch[i - 1]
            blocks = [QuantBlock(cin, ch[i], quant)] + ([QuantBlock(ch[i], ch[i], quant)] if i > 0 else [])
            self.enc.append(nn.Sequential(*blocks))
        self.up = nn.ModuleList(QuantBlock(ch[i + 1], ch[i], quant) for i in reversed(range(depth)))
        self.fuse = nn.ModuleList(QuantBlock(2 * ch[i], ch[i], quant, segments=[ch[i], ch[i]])
                                  for i in reversed(range(depth)))
        self.head = nn.Conv2d(ch[0], num_classes, 1)
        for block in self.quant_blocks().values():
            block.mask_rule = mask_rule

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        skips = []
        for i, level in enumerate(self.enc):
            if i > 0:
                x = F.max_pool2d(x, 2)
            x = level(x)
            skips.append(x)
        for up, fuse, skip in zip(self.up, self.fuse, reversed(skips[:-1])):
            x = up(F.interpolate(x, scale_factor=2, mode="nearest"))
            x = fuse(torch.cat([x, skip], 1))
        return self.head(x)

    def quant_blocks(self) -> dict[str, QuantBlock]:
        """Quantized blocks in execution order, named as in the state dict."""
        return {name: m for name, m in self.named_modules() if isinstance(m, QuantBlock) and m.quantized}

    def mask_ratios(self) -> dict[str, float]:
        return {name: block.mask_ratio for name, block in self.quant_blocks().items()}

    def set_mask_ratios(self, ratios: dict[str, float]) -> None:
        blocks = self.quant_blocks()
        unknown = sorted(set(ratios) - set(blocks))
        if unknown:
            raise BadInputError(f"unknown layer(s) in mask_ratios: {', '.join(unknown)}",
                                f"layers: {', '.join(blocks)}")
        for name, ratio in ratios.items():
            blocks[name].mask_ratio = float(ratio)

    def arch(self) -> dict:
        return {"width": self.width, "depth": self.depth, "num_classes": self.num_classes, "variant": self.variant,
                "mask_rule": self.mask_rule, "mask_ratios": self.mask_ratios()}


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


def augment(images: torch.Tensor, masks: torch.Tensor, generator: torch.Generator):
    """Random horizontal and vertical flips (exact for masks)."""
    if torch.rand(1, generator=generator).item() < 0.5:
        images, masks = images.flip(-1), masks.flip(-1)
    if torch.rand(1, generator=generator).item() < 0.5:
        images, masks = images.flip(-2), masks.flip(-2)
    return images, masks


def train_steps(model: UNet, images: torch.Tensor, masks: torch.Tensor, steps: int, batch_size: int, lr: float,
                seed: int, device: str = "cpu", progress=None, start: int = 0, total: int | None = None,
                optimizer: torch.optim.Optimizer | None = None) -> tuple[list[float], torch.optim.Optimizer]:
    """Adam with a cosine learning-rate schedule over `total` steps (this call runs steps start..start+steps)."""
    total = total or steps
    optimizer = optimizer or torch.optim.Adam(model.parameters(), lr=lr)
    generator = torch.Generator().manual_seed(seed + start)
    model.train()
    losses = []
    iterator = range(start, start + steps)
    for step in (progress(iterator, total=steps, description="train") if progress else iterator):
        for group in optimizer.param_groups:
            group["lr"] = lr * 0.5 * (1 + math.cos(math.pi * step / total))
        idx = torch.randint(0, len(images), (min(batch_size, len(images)),), generator=generator)
        x, y = augment(images[idx], masks[idx], generator)
        loss = F.cross_entropy(model(x.to(device)), y.to(device))
        if not torch.isfinite(loss):
            raise RunError(f"training diverged at step {step} (loss {loss.item()})", "lower lr")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses, optimizer


@torch.no_grad()
def predict(model, images: torch.Tensor, batch_size: int = 16, device: str = "cpu") -> torch.Tensor:
    """Class index per pixel [N, H, W] (works for UNet and PackedUNet)."""
    if isinstance(model, nn.Module):
        model.eval()
    out = [model(images[i:i + batch_size].to(device)).argmax(1).cpu() for i in range(0, len(images), batch_size)]
    return torch.cat(out)


def iou_per_class(pred: torch.Tensor, target: torch.Tensor, num_classes: int) -> list[float | None]:
    """IoU of each class over the whole set (None for a class absent from both prediction and ground truth)."""
    confusion = torch.bincount(target.flatten() * num_classes + pred.flatten(),
                               minlength=num_classes * num_classes).view(num_classes, num_classes).double()
    tp = confusion.diag()
    union = confusion.sum(0) + confusion.sum(1) - tp
    return [None if union[c] == 0 else float(tp[c] / union[c]) for c in range(num_classes)]


def mean_iou(per_class: list[float | None]) -> float:
    present = [v for v in per_class if v is not None]
    return 100.0 * sum(present) / max(1, len(present))


def save_model(model: UNet, out: Path, extra: dict | None = None) -> None:
    from safetensors.torch import save_file

    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(out / WEIGHTS_FILE))
    (out / ARCH_FILE).write_text(json.dumps({**model.arch(), **(extra or {})}, indent=2))


def load_model(path: str | Path) -> tuple[UNet, dict]:
    from safetensors.torch import load_file

    path = Path(path)
    if not (path / ARCH_FILE).is_file() or not (path / WEIGHTS_FILE).is_file():
        raise BadInputError(f"{path} is not a trained MBU-Net directory (needs {ARCH_FILE} and {WEIGHTS_FILE})",
                            "train one with `iclrkit segment mbunet train`")
    try:
        arch = json.loads((path / ARCH_FILE).read_text())
        model = UNet(arch["width"], arch["depth"], arch["num_classes"], arch["variant"], arch.get("mask_rule", "ratio"))
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise BadInputError(f"malformed {path / ARCH_FILE}: {exc}") from None
    model.load_state_dict(load_file(str(path / WEIGHTS_FILE)))
    model.set_mask_ratios(arch.get("mask_ratios", {}))
    return model.eval(), arch


class MBUNetTrainConfig(BaseConfig):
    """Train an MBU-Net (masked binary), a plain binary or an fp32 U-Net on a folder of images + PNG masks or on
    the procedural benchmark. Masked: cost-aware greedy masking within `mask_budget`; with the paper's uniform
    sensitivity (`mask_search=cost`) the masks are fixed before training and train from step 0; with measured gains
    (`probe`) the network first trains binary for `warmup_fraction` of the steps (paper: arXiv 2601.11660; the
    official harness github.com/ChunshuWu/MBU-Net has no training code, so the schedule here is ours)."""

    data: str = "procedural"  # `procedural` or a folder with images/ and masks/
    variant: Literal["masked", "binary", "fp32"] = "masked"
    num_classes: int | None = Field(None, ge=2)  # default: 4 procedural, else max mask value + 1
    size: int = Field(64, ge=16)  # training resolution (multiple of 2^depth)
    n_images: int = Field(600, ge=2)  # procedural scenes to generate
    val_fraction: float = Field(0.2, gt=0, lt=1)
    width: int = Field(16, ge=2)  # channels of the first level (doubles per level)
    depth: int = Field(3, ge=1, le=5)
    steps: int = Field(1500, ge=1)
    batch_size: int = Field(16, ge=1)
    lr: float = Field(2e-3, gt=0)
    mask_rule: Literal["ratio", "threshold"] = "ratio"  # zero a fixed fraction per channel, or TWN |w| <= m·mean|w|
    mask_search: Literal["cost", "probe"] = "cost"  # cost: uniform sensitivity (paper); probe: measured loss gains
    mask_ratio: float = Field(0.5, gt=0)  # cost search: the mask given to chosen layers (fraction, or TWN factor)
    mask_budget: float = Field(0.5, ge=0)  # extra bit-ops allowed, as a fraction of the all-binary network's
    warmup_fraction: float = Field(0.5, ge=0, lt=1)  # probe search: share of steps trained binary before probing
    mask_candidates: list[float] = [0.3, 0.5, 0.7]  # probe search: masks tried per layer
    mask_ratios: dict[str, float] | None = None  # fixed ratios per layer: skips the search
    probe_images: int = Field(32, ge=1)  # training images the search scores gains on

    @model_validator(mode="after")
    def _check(self):
        if self.size % (2**self.depth):
            raise ValueError(f"size {self.size} must be a multiple of 2^depth = {2**self.depth}")
        masks = self.mask_candidates + [self.mask_ratio] + list((self.mask_ratios or {}).values())
        if self.mask_rule == "ratio" and any(not 0 <= r < 1 for r in masks):
            raise ValueError("mask ratios must lie in [0, 1)")
        if self.mask_rule == "threshold" and any(not 0 <= r < 3 for r in masks):
            raise ValueError("TWN threshold factors must lie in [0, 3)")
        return self


def train(config: MBUNetTrainConfig, ctx) -> dict:
    from toolkit.segment.data import load_dataset, split

    data = load_dataset(config.data, config.size, config.num_classes, config.n_images, ctx.seed)
    train_set, val_set = split(data, config.val_fraction, ctx.seed)
    model = UNet(config.width, config.depth, data.num_classes, config.variant, config.mask_rule).to(ctx.device)
    costs = layer_bitops(model, config.size) if config.variant != "fp32" else {}
    progress = ctx.progress
    fit = {"batch_size": config.batch_size, "lr": config.lr, "seed": ctx.seed, "device": ctx.device,
           "progress": progress, "total": config.steps}
    gains: dict = {}
    if config.variant == "masked":
        probing = config.mask_ratios is None and config.mask_search == "probe"
        if config.mask_ratios is not None:
            model.set_mask_ratios(config.mask_ratios)
        elif not probing:
            model.set_mask_ratios(choose_mask_ratios(uniform_gains(costs, config.mask_ratio), costs,
                                                     config.mask_budget))
        warm = int(config.steps * config.warmup_fraction) if probing else 0
        losses, optimizer = train_steps(model, train_set.images, train_set.masks, warm, start=0, **fit)
        if probing:
            probe = slice(0, config.probe_images)  # training images: the validation set stays unseen
            gains = probe_mask_gains(model, train_set.images[probe].to(ctx.device),
                                     train_set.masks[probe].to(ctx.device), config.mask_candidates)
            model.set_mask_ratios(choose_mask_ratios(gains, costs, config.mask_budget))
        more, _ = train_steps(model, train_set.images, train_set.masks, config.steps - warm, start=warm,
                              optimizer=optimizer, **fit)
        losses += more
    else:
        losses, _ = train_steps(model, train_set.images, train_set.masks, config.steps, start=0, **fit)
    per_class = iou_per_class(predict(model, val_set.images, device=ctx.device), val_set.masks, data.num_classes)
    model.cpu()
    save_model(model, ctx.out, {"class_names": data.names, "size": config.size})
    ctx.artifacts += [WEIGHTS_FILE, ARCH_FILE]
    binary_ops = sum(costs.values())
    metrics = {
        "variant": config.variant,
        "miou": mean_iou(per_class),
        "iou": {name: (None if v is None else 100 * v) for name, v in zip(data.names, per_class)},
        "loss_first": losses[0] if losses else None,
        "loss_last": sum(losses[-20:]) / max(1, len(losses[-20:])) if losses else None,
        "mask_rule": model.mask_rule,
        "mask_ratios": model.mask_ratios(),
        "zero_fraction": zero_fractions(model),
        "bitops_vs_binary": total_bitops(costs, model.mask_ratios()) / binary_ops if binary_ops else None,
        "train_images": len(train_set.images), "val_images": len(val_set.images),
    }
    if config.variant == "masked":
        (ctx.path("mask_search.json")).write_text(json.dumps(
            {"search": "fixed" if config.mask_ratios is not None else config.mask_search,
             "gains": {k: {str(r): g for r, g in v.items()} for k, v in gains.items()}, "bitops": costs,
             "chosen": model.mask_ratios()}, indent=2))
    ctx.metrics.update(metrics)
    return metrics
