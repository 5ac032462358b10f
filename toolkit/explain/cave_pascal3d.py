"""Read the official PASCAL3D+ (release 1.1) layout into the CAVE dataset format (toolkit/explain/cave_data.py).

Layout (ftp://cs.stanford.edu/cs/cvgl/PASCAL3D+_release1.1.zip; the ImageNet part, as NOVUM/CAVE train on it):
  ROOT/Image_sets/<cls>_imagenet_train.txt, <cls>_imagenet_val.txt   image names, one per line
  ROOT/Images/<cls>_imagenet/<name>.JPEG
  ROOT/Annotations/<cls>_imagenet/<name>.mat   `record.objects[k]` with class, bbox (x1 y1 x2 y2),
      viewpoint {azimuth, elevation (degrees), distance, focal, px, py, theta (degrees), viewport}
  ROOT/CAD/<cls>.mat   variable <cls>: struct array of CAD models with vertices (V, 3) and 1-based faces (F, 3)
Every image gives one sample: its largest object of the class with a viewpoint. The image is cropped to a square
centred on the principal point (px, py) (where the object origin projects, which our look-at camera puts at the
image centre) and large enough to hold the box, then resized; the field of view follows from the crop side and
the focal length focal * viewport. pix_to_face is ray cast from one CAD model per class (`cad_index`, as CAVE's
single-mesh setting), so face ids mean the same surface patch in every image. CAD axes are z-up; ours are y-up:
(x, y, z) -> (x, z, -y), which maps PASCAL3D+'s camera centre d(cos e sin a, -cos e cos a, sin e) onto ours.
ImageNet train -> split `train`, val -> `test`. Occluders in the photo are not known, so pix_to_face is the
unoccluded CAD rendering (as in CAVE).

OOD-CV (Zhao et al., ECCV 2022; the pose release that NOVUM/CAVE evaluate on) extends PASCAL3D+ with nuisance
subsets whose annotations use the same `record.objects[k].viewpoint` .mat format; its CAD models are PASCAL3D+'s:
  OOD/lists/<cls>_<nuisance>.txt   image names (first field of each line), nuisance in context, pose, shape,
                                   texture, weather (occlusion comes from OccludedPASCAL3D+, not OOD-CV)
  OOD/images/<cls>/<name>.JPEG,  OOD/annotations/<cls>/<name>.mat
Each nuisance becomes the split `ood_<nuisance>` next to PASCAL3D+'s train/test splits.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from toolkit.core.errors import BadInputError, require
from toolkit.explain.render3d import PartMesh, camera_rays, look_at_camera, raycast

SPLIT_LISTS = (("train", "train"), ("val", "test"))  # (Image_sets suffix, dataset split)
OOD_CV_NUISANCES = ("context", "pose", "shape", "texture", "weather")


@dataclass(frozen=True)
class Pascal3DSpec:
    root: str
    classes: tuple[str, ...] = ("aeroplane", "car")
    image_size: int = 64
    cad_index: int = 1  # 1-based CAD model of each class used as the class mesh
    crop_margin: float = 1.2  # crop side = margin x twice the box's largest reach from the principal point
    ood_cv_root: str | None = None  # OOD-CV pose release: its nuisance subsets become splits ood_<nuisance>
    nuisances: tuple[str, ...] = OOD_CV_NUISANCES


def _load_mat(path: Path):
    from scipy.io import loadmat

    if not path.is_file():
        raise BadInputError(f"PASCAL3D+ file not found: {path}")
    try:
        return loadmat(path, squeeze_me=True, struct_as_record=False)
    except Exception as exc:  # scipy raises several unrelated types for corrupt files
        raise BadInputError(f"cannot read {path}: {exc}") from None


def cad_mesh(root: Path, name: str, cad_index: int) -> PartMesh:
    """The class's CAD model cad_index (1-based) in our y-up axes, 0-based triangles."""
    models = np.atleast_1d(_load_mat(root / "CAD" / f"{name}.mat")[name])
    require(1 <= cad_index <= len(models), f"CAD/{name}.mat has {len(models)} models, cad_index={cad_index}")
    model = models[cad_index - 1]
    vertices = np.asarray(model.vertices, dtype=np.float64).reshape(-1, 3)
    triangles = np.asarray(model.faces, dtype=np.int64).reshape(-1, 3) - 1
    require(triangles.min() >= 0 and triangles.max() < len(vertices), f"CAD/{name}.mat: face index out of range")
    ours = np.stack([vertices[:, 0], vertices[:, 2], -vertices[:, 1]], axis=1)
    return PartMesh(ours, triangles, np.zeros(len(triangles), np.int64), ("object",))


def _largest_object(record, name: str):
    best, best_area = None, 0.0
    for obj in np.atleast_1d(record.objects):
        view = getattr(obj, "viewpoint", None)
        if str(getattr(obj, "class", "")) != name or view is None or not np.size(view) or view.distance <= 0:
            continue
        x1, y1, x2, y2 = np.asarray(obj.bbox, dtype=np.float64)
        if (x2 - x1) * (y2 - y1) > best_area:
            best, best_area = obj, (x2 - x1) * (y2 - y1)
    return best


def _sample(image_path: Path, annotation_path: Path, name: str, mesh: PartMesh, spec: Pascal3DSpec):
    from PIL import Image

    obj = _largest_object(_load_mat(annotation_path)["record"], name)
    if obj is None:
        return None
    view = obj.viewpoint
    x1, y1, x2, y2 = np.asarray(obj.bbox, dtype=np.float64)
    reach = max(abs(x1 - view.px), abs(x2 - view.px), abs(y1 - view.py), abs(y2 - view.py), 1.0)
    side = 2 * reach * spec.crop_margin
    if not image_path.is_file():
        raise BadInputError(f"image not found: {image_path}")
    box = (view.px - side / 2, view.py - side / 2, view.px + side / 2, view.py + side / 2)
    image = Image.open(image_path).convert("RGB").transform((spec.image_size,) * 2, Image.Transform.EXTENT, box,
                                                       Image.Resampling.BILINEAR)
    fov = float(np.degrees(2 * np.arctan(side / 2 / (view.focal * view.viewport))))
    pose = np.array([view.azimuth, view.elevation, view.distance], dtype=np.float64)
    camera = look_at_camera(*pose, size=spec.image_size, fov_deg=fov, roll_deg=float(view.theta))
    faces, _ = raycast(mesh, camera_rays(camera))
    return np.asarray(image).transpose(2, 0, 1), faces, pose, fov, float(view.theta)


def _image_names(listing: Path) -> list[str]:
    require(listing.is_file(), f"image list not found: {listing}")
    return [line.split()[0] for line in listing.read_text().splitlines() if line.strip()]


def _listings(spec: Pascal3DSpec, name: str):
    """(split, image names, name -> image path, name -> annotation path) of every split of class `name`."""
    root = Path(spec.root)
    for suffix, split in SPLIT_LISTS:
        folder = f"{name}_imagenet"
        yield (split, _image_names(root / "Image_sets" / f"{folder}_{suffix}.txt"),
               lambda n, f=folder: root / "Images" / f / f"{n}.JPEG",
               lambda n, f=folder: root / "Annotations" / f / f"{n}.mat")
    if spec.ood_cv_root is None:
        return
    ood = Path(spec.ood_cv_root)
    require(ood.is_dir(), f"OOD-CV root not found: {ood}")
    for nuisance in spec.nuisances:
        require(nuisance in OOD_CV_NUISANCES, f"unknown OOD-CV nuisance {nuisance!r}; one of {OOD_CV_NUISANCES}")
        yield (f"ood_{nuisance}", _image_names(ood / "lists" / f"{name}_{nuisance}.txt"),
               lambda n: ood / "images" / name / f"{n}.JPEG", lambda n: ood / "annotations" / name / f"{n}.mat")


def load_pascal3d(spec: Pascal3DSpec, progress=lambda items, **_: items) -> dict[str, np.ndarray]:
    """The dataset dict (format of cave_data.py, plus per-image `fovs` and `rolls` in degrees)."""
    root = Path(spec.root)
    require(root.is_dir(), f"PASCAL3D+ root not found: {root}")
    require(len(spec.classes) >= 1 and spec.image_size >= 16, "need >= 1 class and image_size >= 16")
    rows, data = [], {}
    for label, name in enumerate(spec.classes):
        mesh = cad_mesh(root, name, spec.cad_index)
        data[f"mesh{label}_vertices"], data[f"mesh{label}_triangles"] = mesh.vertices, mesh.triangles
        for split, names, image_path, annotation_path in _listings(spec, name):
            for image_name in progress(names, total=len(names), description=f"{name} {split}"):
                sample = _sample(image_path(image_name), annotation_path(image_name), name, mesh, spec)
                if sample is not None:
                    rows.append((*sample, label, split))
    require(rows, f"no annotated object of {list(spec.classes)} found under {root}")
    images, faces, poses, fovs, rolls, labels, splits = zip(*rows)
    data.update({"images": np.stack(images).astype(np.uint8), "pix_to_face": np.stack(faces).astype(np.int32),
                 "labels": np.array(labels, dtype=np.int64), "split": np.array(splits), "poses": np.stack(poses),
                 "scales": np.ones((len(rows), 3)), "fovs": np.array(fovs), "rolls": np.array(rolls),
                 "classes": np.array(spec.classes)})
    return data
