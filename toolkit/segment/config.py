"""The configs of `iclrkit segment mbunet train | convert | infer | bench` (light to import: the CLI builds its options
from these fields, so each knob is declared once, here)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from toolkit.core.config import BaseConfig


def data_field() -> Any:
    return Field("procedural", description="Folder with images/ and masks/ (PNG class indices; masks optional for "
                                           "infer), or 'procedural'.", json_schema_extra={"short": "-d"})


def model_field() -> Any:
    return Field(description="MBU-Net directory (trained, or packed).", json_schema_extra={"short": "-m"})


class MBUNetTrainConfig(BaseConfig):
    """Train an MBU-Net (masked binary), a plain binary or an fp32 U-Net on a folder of images + PNG masks or on
    the procedural benchmark. Masked: cost-aware greedy masking within `mask_budget`; with the paper's uniform
    sensitivity (`mask_search=cost`) the masks are fixed before training and train from step 0; with measured gains
    (`probe`) the network first trains binary for `warmup_fraction` of the steps (paper: arXiv 2601.11660; the
    official harness github.com/ChunshuWu/MBU-Net has no training code, so the schedule here is ours)."""

    data: str = data_field()
    variant: Literal["masked", "binary", "fp32"] = Field("masked", description="masked (cost-aware masks) | binary "
                                                                               "| fp32.")
    num_classes: int | None = Field(None, ge=2, description="Classes (default: 4 procedural, else the largest mask "
                                                            "value + 1).")
    size: int = Field(64, ge=16, description="Training resolution (multiple of 2^depth).")
    n_images: int = Field(600, ge=2)  # procedural scenes to generate
    val_fraction: float = Field(0.2, gt=0, lt=1)
    width: int = Field(16, ge=2, description="Channels of the first level (doubles per level).")
    depth: int = Field(3, ge=1, le=5)
    steps: int = Field(1500, ge=1, description="Training steps.")
    batch_size: int = Field(16, ge=1)
    lr: float = Field(2e-3, gt=0)
    mask_rule: Literal["ratio", "threshold"] = "ratio"  # zero a fixed fraction per channel, or TWN |w| <= m·mean|w|
    mask_search: Literal["cost", "probe"] = "cost"  # cost: uniform sensitivity (paper); probe: measured loss gains
    mask_ratio: float = Field(0.5, gt=0)  # cost search: the mask given to chosen layers (fraction, or TWN factor)
    mask_budget: float = Field(0.5, ge=0, description="Extra bit-ops allowed for masks, as a fraction of the "
                                                      "all-binary network's.")
    warmup_fraction: float = Field(0.5, ge=0, lt=1)  # probe search: share of steps trained binary before probing
    mask_candidates: list[float] = [0.3, 0.5, 0.7]  # probe search: masks tried per layer
    mask_ratios: dict[str, float] | None = None  # fixed ratios per layer: skips the search
    probe_images: int = Field(32, ge=1)  # training images the search scores gains on
    # issue 30 levers (binary variants; off by default)
    shortcut: bool = False  # Bi-Real: real-valued identity shortcut around every binary conv
    learnable: bool = False  # ReActNet: learnable RSign threshold before each sign + RPReLU (needs shortcut)
    two_stage: float = Field(0.0, ge=0, lt=1)  # share of steps trained with real activations first (stage 1)
    distill: float = Field(0.0, ge=0, le=1)  # weight of KD from an fp32 teacher: (1 - d) CE + d KD
    distill_temperature: float = Field(1.0, gt=0)
    teacher: str | None = None  # trained fp32 MBU-Net directory; default with distill > 0: train one here first

    @model_validator(mode="after")
    def _check(self):
        if self.size % (2**self.depth):
            raise ValueError(f"size {self.size} must be a multiple of 2^depth = {2**self.depth}")
        masks = self.mask_candidates + [self.mask_ratio] + list((self.mask_ratios or {}).values())
        if self.mask_rule == "ratio" and any(not 0 <= r < 1 for r in masks):
            raise ValueError("mask ratios (mask_ratio, mask_candidates, mask_ratios) must lie in [0, 1)")
        if self.mask_rule == "threshold" and any(not 0 <= r < 3 for r in masks):
            raise ValueError("TWN threshold factors (mask_ratio, mask_candidates, mask_ratios) must lie in [0, 3)")
        if self.learnable and not self.shortcut:
            raise ValueError("learnable (RSign/RPReLU) needs shortcut")
        return self


class ConvertConfig(BaseConfig):
    """Pack a trained masked/binary MBU-Net: bit planes + folded BN thresholds; checks the packed model reproduces
    the float model's logits exactly on `check_images` procedural scenes."""

    model: str = model_field()
    check_images: int = Field(4, ge=0, description="Procedural images for the exactness check.")


class InferConfig(BaseConfig):
    """Segment images with a packed (the bit-packed kernels of --device) or float MBU-Net; writes masks/NAME.png
    (class indices, palette) and overlays/NAME.png; reports mIoU per class when ground-truth masks exist."""

    model: str = model_field()
    data: str = data_field()
    size: int | None = Field(None, ge=16, description="Resize images to size x size (default: the training size).")
    n_images: int = Field(8, ge=1)  # procedural scenes
    limit: int | None = Field(None, ge=1, description="Only the first N images.")
    overlays: bool = True
    alpha: float = Field(0.5, ge=0, le=1)  # overlay opacity


class BenchConfig(BaseConfig):
    """Time the packed binary layers against torch fp32 conv2d of the same shapes (each on the layer's real input
    at size x size, batch 1), and the whole packed network against an fp32 U-Net of the same architecture; each
    figure is the best of `repeats` runs."""

    model: str = model_field()
    size: int = Field(256, ge=16, description="Input size (square).")
    repeats: int = Field(20, ge=1, description="Timed repeats per layer: the best of these (robust on a shared "
                                               "machine).")
    threads: int | None = Field(None, ge=1, description="CPU (torch / OpenMP) threads (default: torch's).")
    timer: Literal["wall", "thread-cpu"] = "wall"  # thread-cpu: CPU time of the calling thread (load-proof, 1 thread)
