"""PNG of a k-HC2 solution: points coloured by cluster with their hyperplanes (lines in 2-D, planes in 3-D)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from toolkit.cluster.khc_heuristic import PlaneFit


def plot_solution(points: np.ndarray, fit: PlaneFit, path: Path, title: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    low, high = points.min(axis=0), points.max(axis=0)
    pad = 0.05 * (high - low).max()
    low, high = low - pad, high + pad
    colours = plt.get_cmap("tab10")(np.arange(len(fit.gamma)) % 10)
    fig = plt.figure(figsize=(6, 6))
    ax = fig.add_subplot(projection="3d" if points.shape[1] == 3 else None)
    for j, colour in enumerate(colours):
        members = points[fit.labels == j]
        ax.scatter(*members.T, s=14, color=colour, label=f"plane {j} ({len(members)})")
        _draw_plane(ax, fit.w[j], fit.gamma[j], low, high, colour)
    ax.set_xlim(low[0], high[0])
    ax.set_ylim(low[1], high[1])
    if points.shape[1] == 3:
        ax.set_zlim(low[2], high[2])
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="best")
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def _draw_plane(ax, w: np.ndarray, gamma: float, low: np.ndarray, high: np.ndarray, colour) -> None:
    """Solve w.x = gamma for the coordinate with the largest |w_h| over a grid of the others; clip to the box."""
    h = int(np.argmax(np.abs(w)))
    others = [c for c in range(len(w)) if c != h]
    grids = np.meshgrid(*[np.linspace(low[c], high[c], 50) for c in others], indexing="ij")
    solved = (gamma - sum(w[c] * g for c, g in zip(others, grids))) / w[h]
    solved = np.where((solved >= low[h]) & (solved <= high[h]), solved, np.nan)
    coords = dict(zip(others, grids)) | {h: solved}
    if len(w) == 2:
        ax.plot(coords[0], coords[1], color=colour, linewidth=1.5)
    else:
        ax.plot_surface(coords[0], coords[1], coords[2], color=colour, alpha=0.25)
