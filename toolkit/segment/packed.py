"""Conversion of a trained MBU-Net to bit-packed form and inference on the packed kernels.

Each quantized block (conv -> BN -> sign) becomes: weight bit planes (pos, and neg for masked layers), and one
integer threshold per output channel with a direction flag: bit = s >= t (BN scale > 0) or s <= t (scale < 0;
pitfall 4 of the official harness assumes a positive scale). Thresholds are found by evaluating the float model's
own eval-mode expression `bn_affine` at every reachable integer sum s in [-K, K] (K = Cin·9), so the packed network
reproduces the float network's bits, and therefore its logits, exactly.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from toolkit.core.errors import BadInputError, RunError
from toolkit.segment import kernels, prepack
from toolkit.segment.mbunet import ARCH_FILE, QuantBlock, StemBlock, UNet, bn_affine

PACKED_FILE = "packed.safetensors"


@dataclass
class PackedLayer:
    """One binary/ternary layer: its raw planes and thresholds (the storage form, saved by `save_packed`) and, built
    from them once at construction, the same weights in the layout of the kernel of their device (`prepacked`),
    which every call reads as it is. Treat the tensors as immutable: `to(device)` builds a new layer there."""

    pos: torch.Tensor  # int64 [O, 3, 3, words]
    neg: torch.Tensor
    threshold: torch.Tensor  # int64 [O]
    flip: torch.Tensor  # bool [O]
    binary: bool  # no zero weights: the one-plane kernel path
    segments: list[int]
    block: QuantBlock | None = None  # shortcut networks: the float block whose BN/shortcut tail follows the sums
    prepacked: prepack.PrepackedWeights = field(init=False, repr=False)

    def __post_init__(self):
        self.prepacked = prepack.ternary_prepack(self.pos, self.neg, self.threshold, self.flip)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return prepack.ternary_conv2d_sign_prepacked(x, self.prepacked, stride=1, padding=1, binary=self.binary)

    def sums(self, x: torch.Tensor) -> torch.Tensor:
        return prepack.ternary_conv2d_prepacked(x, self.prepacked, stride=1, padding=1, binary=self.binary)

    def to(self, device: str | torch.device) -> PackedLayer:
        """The layer on `device`: planes and thresholds moved once and prepacked there for that device's kernel
        (the prepacked layout is device-specific); the layer itself when it already lives there."""
        pos = self.pos.to(device)
        if pos is self.pos:
            return self
        return PackedLayer(pos, self.neg.to(device), self.threshold.to(device), self.flip.to(device), self.binary,
                           self.segments, None if self.block is None else self.block.to(device))


@torch.no_grad()
def fold_threshold(block: QuantBlock) -> tuple[torch.Tensor, torch.Tensor]:
    """(threshold int64 [O], flip bool [O]) with sign(bn_affine(s)) == +1  <=>  (s <= t if flip else s >= t)."""
    _, alpha = block.integer_weight()
    reach = block.conv.in_channels * block.conv.kernel_size[0] * block.conv.kernel_size[1]
    s = torch.arange(-reach, reach + 1, dtype=torch.float32)
    grid = s.expand(1, block.conv.out_channels, len(s))
    bits = (bn_affine(grid, alpha, block.bn) >= 0)[0]  # [O, 2K+1]
    rising = (bits[:, 1:] >= bits[:, :-1]).all(1)
    falling = (bits[:, 1:] <= bits[:, :-1]).all(1)
    if not bool((rising | falling).all()):
        raise RunError("BatchNorm is not monotone in the conv sum for some channel; cannot fold to a threshold")
    flip = ~rising
    first_on = torch.where(bits.any(1), bits.float().argmax(1), torch.full_like(bits[:, 0], len(s), dtype=torch.long))
    last_on = torch.where(bits.any(1), len(s) - 1 - bits.flip(1).float().argmax(1),
                          torch.full_like(bits[:, 0], -1, dtype=torch.long))
    threshold = torch.where(flip, last_on, first_on) - reach
    return threshold.to(torch.int64), flip


def pack_block(block: QuantBlock) -> PackedLayer:
    q, _ = block.integer_weight()
    pos, neg = kernels.weight_planes(q.detach(), block.segments)
    threshold, flip = fold_threshold(block)
    return PackedLayer(pos, neg, threshold, flip, binary=block.mask_ratio == 0.0, segments=list(block.segments))


class PackedUNet:
    """The U-Net on packed bits: FP stem -> packed sign bits -> binary/ternary layers (fused thresholds), OR
    max-pool, word-replicating upsampling, word concat for skips -> unpack -> FP 1x1 head."""

    def __init__(self, stem: StemBlock, layers: dict[str, PackedLayer], head: nn.Conv2d, arch: dict):
        self.stem, self.layers, self.head, self.arch = stem.eval(), layers, head.eval(), arch
        self.depth = arch["depth"]

    @property
    def device(self) -> torch.device:
        return next(iter(self.layers.values())).pos.device

    def to(self, device: str | torch.device) -> PackedUNet:
        """Moves every layer and the FP stem/head to `device` once; inference then runs that device's kernels."""
        self.stem, self.head = self.stem.to(device), self.head.to(device)
        self.layers = {name: layer.to(device) for name, layer in self.layers.items()}
        return self

    @torch.no_grad()
    def features(self, x: torch.Tensor, record: dict | None = None) -> torch.Tensor:
        """Packed bits of the last binary layer; `record` collects each layer's packed input by name."""
        def layer(name, bits):
            if record is not None:
                record[name] = bits
            return self.layers[name](bits)

        bits = kernels.pack_sign(self.stem.pre_activation(x))
        skips = []
        for i in range(self.depth + 1):
            if i > 0:
                bits = kernels.maxpool_bits(bits)
            for j in range(1 if i == 0 else 2):
                bits = layer(f"enc.{i}.{j}", bits)
            skips.append(bits)
        for k, skip in enumerate(reversed(skips[:-1])):
            bits = layer(f"up.{k}", kernels.upsample_bits(bits))
            bits = layer(f"fuse.{k}", torch.cat([bits, skip], -1))
        return bits

    @torch.no_grad()
    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.arch.get("shortcut"):
            return self.head(self.real_stream(x))
        bits = self.features(x)
        return self.head(kernels.unpack_sign(bits, [self.arch["width"]]))

    @torch.no_grad()
    def real_stream(self, x: torch.Tensor) -> torch.Tensor:
        """Shortcut (Bi-Real / ReActNet) networks: every layer packs the sign of its real input (per segment),
        the packed kernel gives the integer sums, and the block's own float tail (BN, shortcut, RPReLU) gives the
        next real input, the same float ops as the float model's eval forward."""
        def layer(name, r):
            packed = self.layers[name]
            z = packed.block.sign_input(r)
            bits = torch.cat([kernels.pack_sign(part.contiguous()) for part in z.split(packed.segments, 1)], -1)
            s = packed.sums(bits).permute(0, 3, 1, 2).float().contiguous()  # NCHW like the float model
            return packed.block.tail(bn_affine(s, packed.block.integer_weight()[1], packed.block.bn), r)

        r = self.stem.pre_activation(x)
        skips = []
        for i in range(self.depth + 1):
            if i > 0:
                r = F.max_pool2d(r, 2)
            for j in range(1 if i == 0 else 2):
                r = layer(f"enc.{i}.{j}", r)
            skips.append(r)
        for k, skip in enumerate(reversed(skips[:-1])):
            r = layer(f"up.{k}", F.interpolate(r, scale_factor=2, mode="nearest"))
            r = layer(f"fuse.{k}", torch.cat([r, skip], 1))
        return r


def convert(model: UNet) -> PackedUNet:
    if model.variant == "fp32":
        raise BadInputError("an fp32 model has no binary layers to pack", "train with --variant masked or binary")
    model = model.eval()
    layers = {name: pack_block(block) for name, block in model.quant_blocks().items()}
    if model.shortcut:
        for name, block in model.quant_blocks().items():
            layers[name].block = block
    return PackedUNet(model.stem, layers, model.head, model.arch())


def _dense_bits(planes: torch.Tensor, segments: list[int]) -> torch.Tensor:
    """Word-padded planes -> dense bits (uint8), the storage form: O·9·C bits per plane."""
    flat = kernels.unpack_bool(planes, segments).cpu().numpy()
    return torch.from_numpy(np.packbits(flat.reshape(-1)))


def _words_from_dense(dense: torch.Tensor, shape: list[int], segments: list[int]) -> torch.Tensor:
    bits = np.unpackbits(dense.numpy())[: int(np.prod(shape))].reshape(shape).astype(bool)
    return kernels.pack_bool(torch.from_numpy(bits), segments)


def save_packed(packed: PackedUNet, out: Path, extra: dict | None = None) -> dict:
    """Writes packed.safetensors (dense bit planes; neg only for masked layers; thresholds int32; flips uint8; FP
    stem and head) + mbunet.json. Returns the stored byte counts."""
    from safetensors.torch import save_file

    if packed.arch.get("shortcut"):
        raise BadInputError("saving a packed shortcut (Bi-Real/ReActNet) MBU-Net is not implemented",
                            "run it in memory: toolkit.segment.packed.convert(model)")
    tensors: dict[str, torch.Tensor] = {}
    layer_meta = {}
    for name, layer in packed.layers.items():
        out_ch = layer.pos.shape[0]
        tensors[f"{name}.pos"] = _dense_bits(layer.pos, layer.segments)
        if not layer.binary:
            tensors[f"{name}.neg"] = _dense_bits(layer.neg, layer.segments)
        tensors[f"{name}.threshold"] = layer.threshold.to(torch.int32)
        tensors[f"{name}.flip"] = layer.flip.to(torch.uint8)
        layer_meta[name] = {"out_channels": out_ch, "segments": layer.segments, "binary": layer.binary}
    for prefix, module in (("stem", packed.stem), ("head", packed.head)):
        for key, value in module.state_dict().items():
            if value.is_floating_point():
                tensors[f"{prefix}.{key}"] = value.contiguous()
    save_file(tensors, str(out / PACKED_FILE))
    (out / ARCH_FILE).write_text(json.dumps({**packed.arch, **(extra or {}), "packed": True, "layers": layer_meta},
                                            indent=2))
    return {"packed_bytes": sum(t.numel() * t.element_size() for t in tensors.values()),
            "binary_layer_bytes": sum(t.numel() * t.element_size() for k, t in tensors.items()
                                      if not k.startswith(("stem.", "head.")))}


def load_packed(path: str | Path, device: str | torch.device | None = None) -> tuple[PackedUNet, dict]:
    """The packed network of a `save_packed` directory; with `device`, its planes are moved there before each layer
    prepacks them, so the weights are laid out once, for that device's kernel (default: where they load, the CPU)."""
    from safetensors.torch import load_file

    path = Path(path)
    if not (path / PACKED_FILE).is_file() or not (path / ARCH_FILE).is_file():
        raise BadInputError(f"{path} is not a packed MBU-Net directory (needs {PACKED_FILE} and {ARCH_FILE})",
                            "create one with `iclrkit segment mbunet convert`")
    arch = json.loads((path / ARCH_FILE).read_text())
    tensors = load_file(str(path / PACKED_FILE))
    layers = {}
    for name, meta in arch["layers"].items():
        segments, out_ch = meta["segments"], meta["out_channels"]
        shape = [out_ch, 3, 3, sum(segments)]
        pos = _words_from_dense(tensors[f"{name}.pos"], shape, segments)
        if meta["binary"]:  # neg = valid & ~pos, rebuilt from the channel layout
            neg = kernels.pack_bool(~kernels.unpack_bool(pos, segments), segments)
        else:
            neg = _words_from_dense(tensors[f"{name}.neg"], shape, segments)
        threshold, flip = tensors[f"{name}.threshold"].to(torch.int64), tensors[f"{name}.flip"].bool()
        if device is not None:
            pos, neg, threshold, flip = (t.to(device) for t in (pos, neg, threshold, flip))
        layers[name] = PackedLayer(pos, neg, threshold, flip, meta["binary"], segments)
    template = UNet(arch["width"], arch["depth"], arch["num_classes"], arch["variant"])
    for prefix, module in (("stem", template.stem), ("head", template.head)):
        state = module.state_dict()
        for key in state:
            if f"{prefix}.{key}" in tensors:
                state[key] = tensors[f"{prefix}.{key}"]
        module.load_state_dict(state)
    packed = PackedUNet(template.stem, layers, template.head, arch)
    return (packed if device is None else packed.to(device)), arch


def float_model_bytes(model: UNet) -> int:
    """fp32 storage of every parameter and BN statistic (the baseline the packed size is compared with)."""
    return sum(t.numel() * 4 for t in model.state_dict().values() if t.is_floating_point())


def time_layers(packed: PackedUNet, size: int, repeats: int, seed: int = 0, clock=None) -> dict:
    """Times every packed layer on its real input at size x size, batch 1, against torch fp32 conv2d of the same
    shape (float ±1 input, the layer's {-1, 0, +1} weights); best of `repeats` (the least disturbed run on a shared
    machine, as timeit does), milliseconds, summed over layers. `clock` defaults to wall time (time.perf_counter);
    time.thread_time gives the calling thread's CPU time, which other processes cannot inflate (use one thread)."""
    import time

    clock = clock or time.perf_counter

    x = torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(seed)).to(packed.device)
    sync = torch.cuda.synchronize if packed.device.type == "cuda" else (lambda: None)
    record: dict[str, torch.Tensor] = {}
    packed.features(x, record)
    rows, fp_total, packed_total = [], 0.0, 0.0

    def best_ms(fn):
        fn()
        sync()
        times = []
        for _ in range(repeats):
            start = clock()
            fn()
            sync()
            times.append((clock() - start) * 1000)
        return min(times)

    for name, bits in record.items():
        layer = packed.layers[name]
        act = kernels.unpack_sign(bits, layer.segments).contiguous()
        weight = kernels.planes_to_weight(layer.pos, layer.neg, layer.segments)
        fp_ms = best_ms(lambda act=act, weight=weight: F.conv2d(act, weight, padding=1))
        packed_ms = best_ms(lambda layer=layer, bits=bits: layer(bits))
        rows.append({"layer": name, "shape": list(act.shape), "out_channels": weight.shape[0], "fp32_ms": fp_ms,
                     "packed_ms": packed_ms, "binary": layer.binary})
        fp_total += fp_ms
        packed_total += packed_ms
    return {"fp32_ms": fp_total, "packed_ms": packed_total, "layers": rows}
