"""Segmentation data: a procedural benchmark with exact masks, and the common images/ + masks/ folder layout.

Procedural scenes: a smooth random background texture, then 3-6 objects drawn back to front (later ones occlude
earlier ones, and the mask follows the visible pixels exactly). Each foreground class has its own shape *and*
texture (ellipses with stripes, rectangles with checks, triangles with dots, rings with diagonal stripes);
colours are random per object, so colour alone does not identify a class; Gaussian pixel noise on top.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from toolkit.core.errors import BadInputError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff")
MAX_PROCEDURAL_CLASSES = 5  # background + 4 shape/texture kinds


@dataclass
class SegmentationSet:
    images: torch.Tensor  # float32 [N, 3, H, W], roughly zero-centred
    masks: torch.Tensor | None  # int64 [N, H, W] class indices, None when no ground truth
    num_classes: int
    names: list[str]


def _texture(kind: int, yy: np.ndarray, xx: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Class-specific texture in [0, 1] with random phase and slightly jittered frequency."""
    freq = rng.uniform(0.8, 1.2)
    phase = rng.uniform(0, 2 * np.pi)
    if kind == 1:  # horizontal stripes
        return 0.5 + 0.5 * np.sign(np.sin(yy * 0.9 * freq + phase))
    if kind == 2:  # checks
        return 0.5 + 0.5 * np.sign(np.sin(yy * 0.7 * freq + phase) * np.sin(xx * 0.7 * freq + phase))
    if kind == 3:  # dots
        return (np.sin(yy * 1.3 * freq + phase) * np.sin(xx * 1.3 * freq + phase) > 0.5).astype(np.float64)
    return 0.5 + 0.5 * np.sign(np.sin((xx + yy) * 0.8 * freq + phase))  # diagonal stripes


def _shape_mask(kind: int, yy: np.ndarray, xx: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    cy, cx = rng.uniform(0.15, 0.85, size=2) * size
    r = rng.uniform(0.16, 0.32) * size
    if kind == 1:  # ellipse
        ay, ax, theta = r, r * rng.uniform(0.5, 1.0), rng.uniform(0, np.pi)
        dy, dx = yy - cy, xx - cx
        u, v = dy * np.cos(theta) + dx * np.sin(theta), -dy * np.sin(theta) + dx * np.cos(theta)
        return (u / ay) ** 2 + (v / ax) ** 2 <= 1
    if kind == 2:  # axis-aligned rectangle
        hy, hx = r * rng.uniform(0.5, 1.0), r * rng.uniform(0.5, 1.0)
        return (np.abs(yy - cy) <= hy) & (np.abs(xx - cx) <= hx)
    if kind == 3:  # triangle (three half-planes)
        angles = rng.uniform(0, 2 * np.pi) + np.array([0, 2 * np.pi / 3, 4 * np.pi / 3])
        inside = np.ones_like(yy, dtype=bool)
        for a in angles:
            inside &= (yy - cy) * np.sin(a) + (xx - cx) * np.cos(a) <= r * 0.5
        return inside
    dist = np.hypot(yy - cy, xx - cx)  # ring
    return (dist <= r) & (dist >= r * rng.uniform(0.45, 0.65))


def procedural_scenes(n: int, size: int = 64, num_classes: int = 4, noise: float = 0.12,
                      seed: int = 0) -> SegmentationSet:
    """n scenes of size x size with classes 0 (background) .. num_classes-1."""
    if not 2 <= num_classes <= MAX_PROCEDURAL_CLASSES:
        raise BadInputError(f"procedural data supports 2..{MAX_PROCEDURAL_CLASSES} classes, got {num_classes}")
    if n < 1 or size < 16:
        raise BadInputError(f"procedural data needs n >= 1 and size >= 16, got n={n}, size={size}")
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float64)
    images = np.empty((n, 3, size, size), dtype=np.float32)
    masks = np.zeros((n, size, size), dtype=np.int64)
    for i in range(n):
        # background: two low-frequency waves in a random colour, no class-specific periodic pattern
        wave = np.sin(yy * rng.uniform(0.05, 0.2) + rng.uniform(0, 6)) + np.sin(xx * rng.uniform(0.05, 0.2))
        img = rng.uniform(0.2, 0.8, size=(3, 1, 1)) * (0.75 + 0.125 * wave)[None]
        for _ in range(rng.integers(3, 7)):
            kind = int(rng.integers(1, num_classes))
            inside = _shape_mask(kind, yy, xx, size, rng)
            colour = rng.uniform(0.1, 0.9, size=(3, 1, 1))
            fill = colour * (0.55 + 0.45 * _texture(kind, yy, xx, rng))[None]
            img = np.where(inside[None], fill, img)
            masks[i][inside] = kind
        img = img + rng.normal(0, noise, size=img.shape)
        images[i] = (img - 0.5).astype(np.float32)
    names = ["background", "stripes-ellipse", "check-rectangle", "dots-triangle", "diagonal-ring"][:num_classes]
    return SegmentationSet(torch.from_numpy(images), torch.from_numpy(masks), num_classes, names)


def _find(folder: Path) -> dict[str, Path]:
    return {p.stem: p for p in sorted(folder.iterdir()) if p.suffix.lower() in IMAGE_SUFFIXES}


def load_folder(root: str | Path, size: int | None = None, num_classes: int | None = None,
                require_masks: bool = True, ignore_index: int = 255) -> SegmentationSet:
    """`root/images/NAME.{png,jpg}` with `root/masks/NAME.png` (one class index per pixel, palette or grey),
    the layout of Oxford-IIIT Pet trimaps, CamVid and Cityscapes-style exports. Images are resized to size x size
    (bilinear; masks nearest). Mask pixels equal to ignore_index are mapped to class 0."""
    from PIL import Image

    root = Path(root)
    image_dir = root / "images" if (root / "images").is_dir() else root
    if not root.is_dir():
        raise BadInputError(f"data folder not found: {root}")
    images = _find(image_dir)
    if not images:
        raise BadInputError(f"no images ({', '.join(IMAGE_SUFFIXES)}) in {image_dir}")
    mask_dir = root / "masks"
    masks = _find(mask_dir) if mask_dir.is_dir() else {}
    if require_masks:
        if not masks:
            raise BadInputError(f"no masks in {mask_dir}", "expected root/images/NAME.png and root/masks/NAME.png")
        missing = sorted(set(images) - set(masks))
        if missing:
            raise BadInputError(f"{len(missing)} image(s) without a mask in {mask_dir}, e.g. {missing[0]}")
    names = sorted(images)
    first = Image.open(images[names[0]])
    side = size or min(first.size)
    x = np.stack([np.asarray(Image.open(images[k]).convert("RGB").resize((side, side), Image.BILINEAR),
                             dtype=np.float32) / 255.0 - 0.5 for k in names]).transpose(0, 3, 1, 2)
    y = None
    if masks and all(k in masks for k in names):
        y = np.stack([np.asarray(Image.open(masks[k]).resize((side, side), Image.NEAREST)) for k in names])
        if y.ndim == 4:
            raise BadInputError("masks must be single-channel PNGs of class indices (palette or greyscale)")
        y = np.where(y == ignore_index, 0, y).astype(np.int64)
    if not np.isfinite(x).all():
        raise BadInputError(f"non-finite pixel values in {image_dir}")
    classes = num_classes or (int(y.max()) + 1 if y is not None else 2)
    if y is not None and (int(y.max()) >= classes or classes < 2):
        raise BadInputError(f"mask values go up to {int(y.max())} but num_classes is {classes}")
    return SegmentationSet(torch.from_numpy(np.ascontiguousarray(x)), None if y is None else torch.from_numpy(y),
                           classes, [f"class{c}" for c in range(classes)])


def load_dataset(spec: str, size: int, num_classes: int | None, n: int, seed: int,
                 require_masks: bool = True) -> SegmentationSet:
    """`procedural` (n scenes generated with `seed`) or a folder path."""
    if spec == "procedural":
        return procedural_scenes(n, size=size, num_classes=num_classes or 4, seed=seed)
    return load_folder(spec, size=size, num_classes=num_classes, require_masks=require_masks)


def split(data: SegmentationSet, val_fraction: float, seed: int) -> tuple[SegmentationSet, SegmentationSet]:
    if data.masks is None:
        raise BadInputError("training needs masks")
    n = len(data.images)
    n_val = max(1, round(n * val_fraction))
    if n - n_val < 1:
        raise BadInputError(f"need at least 2 labelled images to split off a validation set, got {n}")
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    val, train = order[:n_val], order[n_val:]
    pick = lambda idx: SegmentationSet(data.images[idx], data.masks[idx], data.num_classes, data.names)
    return pick(train), pick(val)
