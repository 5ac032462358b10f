"""3D Consistency (3D-C) of concept explanations (CAVE, Pham et al., arXiv 2503.13429, OpenReview VSPLa2Sito;
official code https://github.com/phamleyennhi/CAVE, whose `src/evaluation/3d_consistency.py` only dumps pix_to_face
maps: the metric below is written from the paper).

For a class y with n images X_y and a concept h with image-space attribution A(x, h):
  Omega(x)_q = sum of A+(x, h) over the pixels whose pix_to_face is face q of the class mesh;
  3D-C(X_y, h) = 1 - 1/2 * mean over ordered pairs x != x' of || Omega(x) - Omega(x') ||_1.
Two choices the paper leaves implicit are explicit here:
  * every Omega is normalised to sum 1 (so 1/2 ||.||_1 is a total-variation distance in [0, 1]);
    images where the concept puts no mass on the visible mesh have no distribution and are left out;
  * the mean runs over the n(n-1) distinct pairs (the paper writes 1/n^2), so fully disjoint maps score 0.
The score is averaged over concepts (with at least two images carrying mass) and classes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from toolkit.core.errors import BadInputError, require
from toolkit.core.records import write_json
from toolkit.explain.config import ConsistencyConfig
from toolkit.explain.render3d import NO_FACE


def project_to_faces(attribution: np.ndarray, pix_to_face: np.ndarray, n_faces: int) -> np.ndarray:
    """Omega: the positive attribution summed per mesh face (pixels on no face are dropped). Shapes (H, W) -> (F,)."""
    on_mesh = pix_to_face != NO_FACE
    return np.bincount(pix_to_face[on_mesh], weights=np.maximum(attribution[on_mesh], 0), minlength=n_faces)


def consistency_3d(omegas: np.ndarray) -> float:
    """3D-C of one concept from its per-image face distributions (n, F); NaN when < 2 images carry mass."""
    mass = omegas.sum(axis=1)
    kept = omegas[mass > 0] / mass[mass > 0, None]
    n = len(kept)
    if n < 2:
        return float("nan")
    distances = np.abs(kept[:, None, :] - kept[None, :, :]).sum(axis=-1)
    return float(1 - 0.5 * distances.sum() / (n * (n - 1)))


def concept_consistency(maps: np.ndarray, pix_to_face: np.ndarray, labels: np.ndarray,
                        faces_per_class: list[int]) -> np.ndarray:
    """3D-C per (class, concept): maps (N, D, H, W) are the attributions of the D concepts of each image's class."""
    require(maps.ndim == 4, f"attribution maps must be (N, D, H, W), got shape {maps.shape}")
    require(maps.shape[0] == len(pix_to_face) == len(labels), "maps, pix_to_face and labels differ in length")
    require(maps.shape[2:] == pix_to_face.shape[1:], f"maps are {maps.shape[2:]} pixels but pix_to_face is "
                                                     f"{pix_to_face.shape[1:]}: resize the maps to the images")
    require(np.isfinite(maps).all(), "attribution maps contain NaN or infinite values")
    scores = np.full((len(faces_per_class), maps.shape[1]), np.nan)
    for c, n_faces in enumerate(faces_per_class):
        members = np.nonzero(labels == c)[0]
        for j in range(maps.shape[1]):
            omegas = np.stack([project_to_faces(maps[i, j], pix_to_face[i], n_faces) for i in members]) \
                if len(members) else np.zeros((0, n_faces))
            scores[c, j] = consistency_3d(omegas)
    return scores


def mean_score(scores: np.ndarray) -> float:
    finite = scores[np.isfinite(scores)]
    return float(finite.mean()) if finite.size else float("nan")


def finite_or_none(value: float) -> float | None:
    """JSON has no NaN: a concept that fired on fewer than two images of every class has no 3D-C."""
    return None if np.isnan(value) else value


def object_masks(pix_to_face: np.ndarray) -> np.ndarray:
    """The uniform attribution (1 on every visible object pixel) as one concept: (N, 1, H, W). Its 3D-C is the
    chance level set by visibility alone, which random maps approach."""
    return (pix_to_face != NO_FACE).astype(np.float64)[:, None]


def load_attributions(path: str | Path) -> dict[str, np.ndarray]:
    path = Path(path)
    if not path.is_file():
        raise BadInputError(f"attribution file not found: {path}")
    try:
        with np.load(path, allow_pickle=False) as archive:
            data = {key: archive[key] for key in archive.files}
    except Exception as exc:  # zip/npy errors carry no useful type
        raise BadInputError(f"cannot read attributions {path}: {exc}") from None
    require("maps" in data and "index" in data, f"{path} must hold `maps` (N, D, H, W) and `index` (N,)")
    require(len(data["maps"]) > 0, f"{path} holds no maps")
    require(len(data["maps"]) == len(data["index"]), f"{path}: maps and index differ in length")
    return data


def consistency_report(maps, pix_to_face, labels, faces_per_class, classes) -> dict:
    scores = concept_consistency(maps, pix_to_face, labels, faces_per_class)
    chance = concept_consistency(object_masks(pix_to_face), pix_to_face, labels, faces_per_class)
    return {"consistency_3d": finite_or_none(mean_score(scores)), "chance_3d": finite_or_none(mean_score(chance)),
            "per_class": {str(name): finite_or_none(mean_score(scores[c])) for c, name in enumerate(classes)},
            "per_concept": [[None if np.isnan(v) else round(float(v), 6) for v in row] for row in scores]}


def run(config: ConsistencyConfig, ctx) -> dict:

    from toolkit.explain.cave_data import load_dataset

    data = load_dataset(config.data)
    attributions = load_attributions(config.attributions)
    index = attributions["index"].astype(np.int64)
    require(index.min() >= 0 and index.max() < len(data["labels"]), "attribution index out of range of the dataset")
    faces = [len(data[f"mesh{c}_triangles"]) for c in range(len(data["classes"]))]
    report = consistency_report(attributions["maps"].astype(np.float64), data["pix_to_face"][index],
                                data["labels"][index], faces, data["classes"])
    method = config.method or str(attributions.get("method", Path(config.attributions).stem))
    report = {"method": method, "n_images": int(len(index)), **report}
    if ctx.out is not None:
        write_json(ctx.path("consistency.json"), report)
    ctx.metrics.update({k: report[k] for k in ("method", "n_images", "consistency_3d", "chance_3d")})
    return report
