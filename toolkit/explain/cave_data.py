"""Posed 3D image sets for CAVE: a synthetic set rendered here and the dataset file format every command reads.

A dataset is one .npz with
  images (N, 3, S, S) uint8, labels (N,), split (N,) str in SPLITS, poses (N, 3) azimuth/elevation/distance,
  scales (N, 3) per-axis deformation of the class mesh, pix_to_face (N, S, S) int32 (-1: background or occluded),
  classes (C,) str, and per class c: mesh{c}_vertices (V, 3), mesh{c}_triangles (F, 3) of the undeformed mesh;
  optionally fovs (N,) and rolls (N,) in degrees (the camera of each photo; default 40 and 0).
Face ids refer to the class mesh, so a face means the same surface patch in every image of the class.

Synthetic OOD splits re-use the iid test poses: `occlusion` pastes clutter patches over the object (its pixels
map to no face), `texture` recolours every part with unseen colours, `noise` adds Gaussian pixel noise;
`unseen_pose` renders new images at elevations outside the training range.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from toolkit.core.errors import BadInputError, require
from toolkit.explain.render3d import (
    CLASS_MESHES,
    NO_FACE,
    PALETTES,
    PartMesh,
    camera_rays,
    class_mesh,
    look_at_camera,
    raycast,
    shade,
)

SPLITS = ("train", "test", "occlusion", "texture", "noise", "unseen_pose")
REQUIRED_KEYS = ("images", "labels", "split", "poses", "scales", "pix_to_face", "classes")


@dataclass(frozen=True)
class SyntheticSpec:
    n_classes: int = 4  # first n of car, house, mug, plane
    n_train_per_class: int = 100
    n_test_per_class: int = 40
    image_size: int = 64
    elevation_range: tuple[float, float] = (5.0, 40.0)  # degrees, train and iid test
    unseen_elevation_range: tuple[float, float] = (50.0, 75.0)
    distance_range: tuple[float, float] = (4.3, 5.2)
    deformation: float = 0.15  # per-axis scale drawn from 1 +- deformation
    occlusion_fraction: float = 0.4  # share of object pixels hidden in the occlusion split
    noise_std: float = 0.2  # Gaussian pixel noise (images in [0, 1]) in the noise split


@dataclass(frozen=True)
class Render:
    image: np.ndarray  # (S, S, 3) float in [0, 1]
    pix_to_face: np.ndarray  # (S, S) int


def _clutter(rng: np.random.Generator, size: int) -> np.ndarray:
    """A background of a random grey ramp plus random coloured rectangles (clutter for the contrastive loss)."""
    ramp = np.linspace(rng.uniform(0.2, 0.6), rng.uniform(0.2, 0.6), size)
    image = np.broadcast_to(ramp[:, None, None], (size, size, 3)).copy()
    for _ in range(rng.integers(3, 8)):
        r0, c0 = rng.integers(0, size, 2)
        h, w = rng.integers(size // 10, size // 3, 2)
        image[r0:r0 + h, c0:c0 + w] = rng.uniform(0.0, 1.0, 3)
    return image


def render(mesh: PartMesh, part_colours: np.ndarray, pose: np.ndarray, scale: np.ndarray, size: int,
           rng: np.random.Generator) -> Render:
    camera = look_at_camera(*pose, size=size)
    face_ids, normals = raycast(mesh.scaled(scale), camera_rays(camera))
    light = np.array([rng.uniform(-1, 1), rng.uniform(0.3, 1), rng.uniform(-1, 1)])
    light = light / np.linalg.norm(light)
    image = shade(part_colours[mesh.face_part], face_ids, normals, light, _clutter(rng, size))
    return Render(image, face_ids)


def occlude(image: np.ndarray, pix_to_face: np.ndarray, fraction: float, rng: np.random.Generator):
    """Paste clutter rectangles over the object until `fraction` of its pixels are hidden (at most 20 patches)."""
    image, pix_to_face = image.copy(), pix_to_face.copy()
    rows, cols = np.nonzero(pix_to_face != NO_FACE)
    total = len(rows)
    if total == 0:
        return image, pix_to_face
    size = image.shape[0]
    for _ in range(20):
        if (pix_to_face != NO_FACE).sum() <= (1 - fraction) * total:
            break
        centre = rng.integers(len(rows))
        h, w = rng.integers(size // 8, size // 4, 2)
        r0, c0 = max(rows[centre] - h // 2, 0), max(cols[centre] - w // 2, 0)
        image[r0:r0 + h, c0:c0 + w] = rng.uniform(0, 1, 3) * rng.uniform(0.7, 1.0, (min(h, size - r0),
                                                                                   min(w, size - c0), 1))
        pix_to_face[r0:r0 + h, c0:c0 + w] = NO_FACE
    return image, pix_to_face


def build_synthetic(spec: SyntheticSpec, seed: int, progress=lambda items, **_: items) -> dict[str, np.ndarray]:
    require(1 <= spec.n_classes <= len(CLASS_MESHES), f"n_classes must be in 1..{len(CLASS_MESHES)}")
    require(spec.n_train_per_class >= 1 and spec.n_test_per_class >= 1, "need >= 1 train and test image per class")
    require(spec.image_size >= 16, "image_size must be >= 16")
    rng = np.random.default_rng(seed)
    classes = list(CLASS_MESHES)[:spec.n_classes]
    meshes = [class_mesh(name) for name in classes]
    records: list[tuple] = []  # (image, pix_to_face, label, split, pose, scale)

    def pose(elevations):
        return np.array([rng.uniform(0, 360), rng.uniform(*elevations), rng.uniform(*spec.distance_range)])

    jobs = [(label, split) for label in range(len(classes))
            for split, n in (("train", spec.n_train_per_class), ("test", spec.n_test_per_class),
                             ("unseen_pose", spec.n_test_per_class)) for _ in range(n)]
    for label, split in progress(jobs, total=len(jobs), description="rendering"):
        mesh, palette = meshes[label], np.array(PALETTES[classes[label]])
        p = pose(spec.unseen_elevation_range if split == "unseen_pose" else spec.elevation_range)
        scale = 1 + rng.uniform(-spec.deformation, spec.deformation, 3)
        shot = render(mesh, palette, p, scale, spec.image_size, rng)
        records.append((shot.image, shot.pix_to_face, label, split, p, scale))
        if split != "test":
            continue
        image, faces = occlude(shot.image, shot.pix_to_face, spec.occlusion_fraction, rng)
        records.append((image, faces, label, "occlusion", p, scale))
        swapped = render(mesh, rng.uniform(0, 1, palette.shape), p, scale, spec.image_size, rng)
        records.append((swapped.image, swapped.pix_to_face, label, "texture", p, scale))
        noisy = np.clip(shot.image + rng.normal(0, spec.noise_std, shot.image.shape), 0, 1)
        records.append((noisy, shot.pix_to_face, label, "noise", p, scale))
    images, faces, labels, splits, poses, scales = zip(*records)
    data = {"images": np.round(np.stack(images).transpose(0, 3, 1, 2) * 255).astype(np.uint8),
            "pix_to_face": np.stack(faces).astype(np.int32), "labels": np.array(labels, dtype=np.int64),
            "split": np.array(splits), "poses": np.stack(poses), "scales": np.stack(scales),
            "classes": np.array(classes)}
    for index, mesh in enumerate(meshes):
        data[f"mesh{index}_vertices"] = mesh.vertices
        data[f"mesh{index}_triangles"] = mesh.triangles
    return data


def save_dataset(data: dict[str, np.ndarray], path: Path) -> None:
    np.savez_compressed(path, **data)


def load_dataset(path: str | Path) -> dict[str, np.ndarray]:
    """Read and validate a dataset .npz (format in the module docstring); every problem is one BadInputError."""
    path = Path(path)
    if not path.is_file():
        raise BadInputError(f"dataset not found: {path}", "build one with `iclrkit explain cave --data synthetic`")
    try:
        with np.load(path, allow_pickle=False) as archive:
            data = {key: archive[key] for key in archive.files}
    except Exception as exc:  # zip/npy errors carry no useful type
        raise BadInputError(f"cannot read dataset {path}: {exc}") from None
    missing = [key for key in REQUIRED_KEYS if key not in data]
    require(not missing, f"dataset {path} lacks {missing}")
    n = len(data["labels"])
    require(n > 0, f"dataset {path} is empty")
    for key in ("images", "split", "poses", "scales", "pix_to_face"):
        require(len(data[key]) == n, f"dataset {path}: {key} has {len(data[key])} rows, labels has {n}")
    require(data["images"].ndim == 4 and data["images"].shape[1] == 3, "images must be (N, 3, S, S)")
    require(data["pix_to_face"].shape == (n, *data["images"].shape[2:]), "pix_to_face must be (N, S, S)")
    n_classes = len(data["classes"])
    require(0 <= data["labels"].min() and data["labels"].max() < n_classes, "labels out of range of classes")
    require(np.isfinite(data["poses"]).all() and np.isfinite(data["scales"]).all(), "poses/scales contain NaN")
    for key in ("fovs", "rolls"):  # optional per-image camera of datasets from photos (cave_pascal3d.py)
        if key in data:
            require(data[key].shape == (n,) and np.isfinite(data[key]).all(), f"{key} must be (N,) finite degrees")
    unknown = sorted(split for split in set(data["split"].tolist()) - set(SPLITS) if not split.startswith("ood_"))
    require(not unknown, f"unknown split names {unknown}; expected {SPLITS} or ood_<nuisance>")
    for c in range(n_classes):
        require(f"mesh{c}_vertices" in data and f"mesh{c}_triangles" in data, f"dataset lacks the mesh of class {c}")
        n_faces = len(data[f"mesh{c}_triangles"])
        faces = data["pix_to_face"][data["labels"] == c]
        require(faces.max(initial=NO_FACE) < n_faces, f"pix_to_face of class {c} refers to a missing face")
    return data
