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
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from toolkit.core.errors import BadInputError

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


def channel_shortcut(r: torch.Tensor, cout: int) -> torch.Tensor:
    """Parameter-free real-valued shortcut from cin to cout channels: identity (cin = cout), channel duplication
    (cout = 2 cin) or the mean of the two channel halves (cin = 2 cout; for a fuse block: (up + skip) / 2)."""
    cin = r.shape[1]
    if cin == cout:
        return r
    if cout == 2 * cin:
        return torch.cat([r, r], 1)
    if cin == 2 * cout:
        return (r[:, :cout] + r[:, cout:]) / 2
    raise BadInputError(f"no parameter-free shortcut from {cin} to {cout} channels")


class QuantBlock(nn.Module):
    """3x3 conv (no bias) -> BatchNorm -> activation. Quantized: weights q·alpha (STE), sign activation, inputs ±1.
    Float (fp32 variant): plain conv -> BN -> ReLU. `segments` records the channel groups of a concatenated input.

    shortcut (Bi-Real Net, Liu et al. 2018): the block takes and returns the real-valued stream r; it binarises its
    own input, sign(r - beta), and adds r (`channel_shortcut`) to the BN output: r' = BN(conv(sign(r))) + r.
    learnable (ReActNet, Liu et al. 2020; needs shortcut): RSign's per-channel threshold beta before the sign and
    RPReLU(x) = PReLU(x - gamma) + zeta on the block output, all learned. `binary_act` False (stage 1 of two-stage
    training) replaces the activation sign by hardtanh in training; eval always uses the sign."""

    def __init__(self, cin: int, cout: int, quantized: bool, segments: list[int] | None = None,
                 shortcut: bool = False, learnable: bool = False):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(cout)
        self.quantized = quantized
        self.mask_ratio = 0.0
        self.mask_rule = "ratio"
        self.segments = segments or [cin]
        self.shortcut = shortcut and quantized
        self.learnable = learnable and self.shortcut
        self.binary_act = True
        if self.learnable:
            self.beta = nn.Parameter(torch.zeros(1, cin, 1, 1))
            self.rp_gamma = nn.Parameter(torch.zeros(1, cout, 1, 1))
            self.rp_slope = nn.Parameter(torch.full((1, cout, 1, 1), 0.25))
            self.rp_zeta = nn.Parameter(torch.zeros(1, cout, 1, 1))

    def integer_weight(self) -> tuple[torch.Tensor, torch.Tensor]:
        return quantize_weight(self.conv.weight, self.mask_ratio, self.mask_rule)

    def _activate(self, z: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return sign(z)
        return SignSTE.apply(z) if self.binary_act else F.hardtanh(z)

    def sign_input(self, r: torch.Tensor) -> torch.Tensor:
        """The real stream before the sign: r - beta (RSign) or r."""
        return r - self.beta if self.learnable else r

    def tail(self, y: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        """Real-stream output from the BN output y and the block input r (the same float ops run in packed
        inference, which is what keeps it bit-exact)."""
        out = y + channel_shortcut(r, self.conv.out_channels)
        if self.learnable:
            out = out - self.rp_gamma
            out = torch.where(out >= 0, out, out * self.rp_slope) + self.rp_zeta
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.quantized:
            return F.relu(self.bn(self.conv(x)))
        w = self.conv.weight
        q, alpha = self.integer_weight()
        a = self._activate(self.sign_input(x)) if self.shortcut else x
        if not self.training:
            s = F.conv2d(a, q, padding=1).round()  # exact integers whatever algorithm conv2d picks
            y = bn_affine(s, alpha.detach(), self.bn)
            return self.tail(y, x) if self.shortcut else sign(y)
        scale = alpha.detach().view(-1, 1, 1, 1)
        q_ste = w / scale + (q - w / scale).detach()
        y = self.bn(F.conv2d(a, q_ste, padding=1) * alpha.view(1, -1, 1, 1))
        return self.tail(y, x) if self.shortcut else self._activate(y)


class StemBlock(nn.Module):
    """Full-precision first conv (RGB in) -> BN -> sign (binary variants) or ReLU (fp32)."""

    def __init__(self, cout: int, binary_out: bool, real_out: bool = False):
        super().__init__()
        self.conv = nn.Conv2d(3, cout, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(cout)
        self.binary_out = binary_out
        self.real_out = real_out  # shortcut networks: the real-valued stream starts here
        self.binary_act = True

    def pre_activation(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.conv(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.pre_activation(x)
        if not self.binary_out:
            return F.relu(y)
        if self.real_out:
            return y
        if not self.training:
            return sign(y)
        return SignSTE.apply(y) if self.binary_act else F.hardtanh(y)


class UNet(nn.Module):
    """U-Net of `depth` down/up levels with channels width·2^i. Quantized blocks are named enc{i}.{j}, up{i},
    fuse{i}; their `mask_ratio` is 0 (binary) unless cost-aware masking gives them zeros."""

    def __init__(self, width: int = 16, depth: int = 3, num_classes: int = 4, variant: str = "masked",
                 mask_rule: str = "ratio", shortcut: bool = False, learnable: bool = False):
        super().__init__()
        if variant not in VARIANTS:
            raise BadInputError(f"unknown variant '{variant}'", f"use one of {', '.join(VARIANTS)}")
        if mask_rule not in MASK_RULES:
            raise BadInputError(f"unknown mask rule '{mask_rule}'", f"use one of {', '.join(MASK_RULES)}")
        self.width, self.depth, self.num_classes, self.variant = width, depth, num_classes, variant
        self.mask_rule = mask_rule
        quant = variant != "fp32"
        if learnable and not shortcut:
            raise BadInputError("learnable thresholds (RSign/RPReLU) act on the real-valued stream",
                                "use them with shortcut")
        self.shortcut, self.learnable = shortcut and quant, learnable and quant
        ch = [width * 2**i for i in range(depth + 1)]
        self.stem = StemBlock(ch[0], binary_out=quant, real_out=self.shortcut)
        extra = {"shortcut": self.shortcut, "learnable": self.learnable}
        self.enc = nn.ModuleList()
        for i in range(depth + 1):
            cin = ch[0] if i == 0 else ch[i - 1]
            blocks = [QuantBlock(cin, ch[i], quant, **extra)] + ([QuantBlock(ch[i], ch[i], quant, **extra)]
                                                                 if i > 0 else [])
            self.enc.append(nn.Sequential(*blocks))
        self.up = nn.ModuleList(QuantBlock(ch[i + 1], ch[i], quant, **extra) for i in reversed(range(depth)))
        self.fuse = nn.ModuleList(QuantBlock(2 * ch[i], ch[i], quant, segments=[ch[i], ch[i]], **extra)
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

    def set_binary_activations(self, on: bool) -> None:
        """Two-stage training: stage 1 (off) trains binary weights with real (hardtanh) activations."""
        self.stem.binary_act = on
        for block in self.quant_blocks().values():
            block.binary_act = on

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
                "mask_rule": self.mask_rule, "mask_ratios": self.mask_ratios(), "shortcut": self.shortcut,
                "learnable": self.learnable}


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
        model = UNet(arch["width"], arch["depth"], arch["num_classes"], arch["variant"], arch.get("mask_rule", "ratio"),
                     bool(arch.get("shortcut", False)), bool(arch.get("learnable", False)))
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise BadInputError(f"malformed {path / ARCH_FILE}: {exc}") from None
    model.load_state_dict(load_file(str(path / WEIGHTS_FILE)))
    model.set_mask_ratios(arch.get("mask_ratios", {}))
    return model.eval(), arch
