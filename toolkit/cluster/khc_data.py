"""k-HC point sets: readers (CSV/NPY), instance checks, the bounding box, and the planted-instance generator.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from toolkit.core.errors import BadInputError, require

# ---------------------------------------------------------------------------------------------------- data

def load_points(path: str) -> np.ndarray:
    """n x d float array from .csv/.npy; rejects missing files, ragged or non-numeric rows, NaN/inf."""
    file = Path(path)
    require(file.is_file(), f"data file not found: {path}")
    if file.suffix.lower() == ".npy":
        try:
            points = np.load(file, allow_pickle=False)
        except (ValueError, OSError, EOFError) as exc:
            raise BadInputError(f"cannot read {path} as .npy: {exc}") from None
    else:
        points = _read_csv(file)
    require(np.issubdtype(points.dtype, np.number), f"{path}: points must be numeric, got dtype {points.dtype}")
    points = np.asarray(points, dtype=np.float64)
    if points.ndim == 1:
        points = points[:, None]
    require(points.ndim == 2 and points.shape[0] > 0, f"{path}: expected an n x d array of points, got {points.shape}")
    bad = np.flatnonzero(~np.isfinite(points).all(axis=1))
    require(bad.size == 0, f"{path}: {bad.size} row(s) contain NaN or inf (first: row {bad[:5].tolist()})",
            "drop or impute those rows")
    return points


def _read_csv(file: Path) -> np.ndarray:
    lines = [line for line in file.read_text().splitlines() if line.strip()]
    require(bool(lines), f"{file}: no rows")
    try:
        [float(v) for v in lines[0].split(",")]
    except ValueError:
        lines = lines[1:]  # a header row
    rows = []
    for number, line in enumerate(lines, start=1):
        try:
            rows.append([float(v) for v in line.split(",")])
        except ValueError:
            raise BadInputError(f"{file}: data row {number} is not numeric: {line[:60]!r}") from None
    require(bool(rows), f"{file}: no data rows")
    widths = {len(r) for r in rows}
    require(len(widths) == 1, f"{file}: rows have different numbers of columns {sorted(widths)}")
    return np.array(rows)


def check_instance(points: np.ndarray, k: int) -> None:
    """The problem is well posed: 1 <= k <= n, d >= 2 and the points are not all identical."""
    n, d = points.shape
    require(k >= 1, f"k must be >= 1, got {k}")
    require(k <= n, f"k = {k} exceeds the number of points n = {n}")
    require(d >= 2, "d = 1: a hyperplane in R^1 is a single point, so k-HC2 is 1-D k-means",
            "use k-means for 1-D data, or pass points with >= 2 columns")
    require(float(np.ptp(points, axis=0).max()) > 0, "all points are identical (constant data): nothing to cluster")


@dataclass
class Box:
    """Translation to the nonnegative orthant and the paper's bounds b (hypercube edge) and dU = b sqrt(d)."""

    shift: np.ndarray
    b: float
    d_upper: float

    @classmethod
    def of(cls, points: np.ndarray) -> Box:
        b = float(np.ptp(points, axis=0).max())
        return cls(shift=points.min(axis=0), b=b, d_upper=b * math.sqrt(points.shape[1]))




# ---------------------------------------------------------------------------------------------------- generator

@dataclass
class PlantedInstance:
    points: np.ndarray   # (n, d)
    labels: np.ndarray   # planted plane of each point; -1 for outliers
    w: np.ndarray        # (k, d) unit normals
    gamma: np.ndarray    # (k,)


def planted_instance(n: int, d: int, k: int, noise: float = 0.003, outlier_fraction: float = 0.0,
                     seed: int = 0) -> PlantedInstance:
    """Paper §5 generator: (w_j, gamma_j) ~ U[-1, 1]; points U[-1, 1]^d projected onto their plane, plus Gaussian
    noise along the normal with variance U[0.7 noise, noise] per plane; then a share of uniform outliers."""
    rng = np.random.default_rng(seed)
    w = rng.uniform(-1, 1, (k, d))
    gamma = rng.uniform(-1, 1, k)
    scale = np.linalg.norm(w, axis=1)
    w, gamma = w / scale[:, None], gamma / scale
    labels = rng.permutation(np.arange(n) % k)
    raw = rng.uniform(-1, 1, (n, d))
    offset = np.einsum("nd,nd->n", raw, w[labels]) - gamma[labels]
    variance = rng.uniform(0.7 * noise, noise, k)
    along_normal = rng.normal(0, np.sqrt(variance[labels]))
    points = raw - (offset - along_normal)[:, None] * w[labels]
    outliers = rng.choice(n, round(outlier_fraction * n), replace=False)
    points[outliers] = rng.uniform(points.min(axis=0), points.max(axis=0), (len(outliers), d))
    labels[outliers] = -1
    return PlantedInstance(points=points, labels=labels, w=w, gamma=gamma)
