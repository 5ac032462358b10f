"""Alternating k-planes heuristic (Bradley & Mangasarian 2000) with random restarts, compiled with numba.

Each restart starts from k hyperplanes through d random points each.

Each round assigns every point to its nearest hyperplane, then refits every cluster by total least squares:
w_j is the eigenvector of the smallest eigenvalue of the centred scatter matrix and gamma_j = w_j . mean_j.
It gives an upper bound (a feasible solution) used standalone, as the baseline, and as SCIP's warm start.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np


@dataclass
class PlaneFit:
    """k hyperplanes {x : w_j . x = gamma_j} with unit w_j, an assignment, and its sum of squared distances."""

    w: np.ndarray        # (k, d), unit rows
    gamma: np.ndarray    # (k,)
    labels: np.ndarray   # (n,) cluster of each point
    objective: float     # sum_i dist(a_i, plane of labels[i])^2


@numba.njit(cache=True)
def _fit_plane(points, mask):
    """Total least squares hyperplane of the masked points: (w, gamma, sum of squared distances)."""
    d = points.shape[1]
    count = 0
    mean = np.zeros(d)
    for i in range(points.shape[0]):
        if mask[i]:
            mean += points[i]
            count += 1
    w = np.zeros(d)
    w[0] = 1.0
    if count == 0:
        return w, 0.0, 0.0
    mean /= count
    scatter = np.zeros((d, d))
    for i in range(points.shape[0]):
        if mask[i]:
            diff = points[i] - mean
            scatter += np.outer(diff, diff)
    values, vectors = np.linalg.eigh(scatter)
    w = vectors[:, 0].copy()
    return w, float(w @ mean), max(float(values[0]), 0.0)


@numba.njit(cache=True)
def _refit(points, labels, k):
    d = points.shape[1]
    w = np.zeros((k, d))
    gamma = np.zeros(k)
    for j in range(k):
        wj, gj, _ = _fit_plane(points, labels == j)
        w[j] = wj
        gamma[j] = gj
    return w, gamma


@numba.njit(cache=True)
def _assign(points, w, gamma):
    """Nearest plane of every point and the summed squared distance."""
    n = points.shape[0]
    labels = np.empty(n, dtype=np.int64)
    total = 0.0
    for i in range(n):
        residuals = np.abs(w @ points[i] - gamma)
        labels[i] = np.argmin(residuals)
        total += residuals[labels[i]] ** 2
    return labels, total


@numba.njit(cache=True)
def _fill_empty(points, labels, w, gamma, k):
    """Give every empty cluster the point currently farthest from its plane (an empty plane wastes a cluster)."""
    for j in range(k):
        if np.sum(labels == j) == 0:
            worst, worst_dist = -1, -1.0
            for i in range(points.shape[0]):
                if np.sum(labels == labels[i]) > 1:
                    dist = abs(w[labels[i]] @ points[i] - gamma[labels[i]])
                    if dist > worst_dist:
                        worst, worst_dist = i, dist
            if worst >= 0:
                labels[worst] = j
    return labels


@numba.njit(cache=True)
def _random_planes(points, k):
    """Each plane through d random points: starts near the data's own structure, unlike a random assignment,
    whose k fitted planes all start out alike (the all-average local minimum)."""
    n, d = points.shape
    w = np.zeros((k, d))
    gamma = np.zeros(k)
    for j in range(k):
        mask = np.zeros(n, dtype=np.bool_)
        mask[np.random.choice(n, min(d, n), replace=False)] = True
        wj, gj, _ = _fit_plane(points, mask)
        w[j] = wj
        gamma[j] = gj
    return w, gamma


@numba.njit(cache=True)
def _k_planes_restarts(points, k, restarts, max_iter, seed):
    np.random.seed(seed)
    n = points.shape[0]
    best_labels = np.zeros(n, dtype=np.int64)
    best_objective = np.inf
    for _ in range(restarts):
        w, gamma = _random_planes(points, k)
        labels, _ = _assign(points, w, gamma)
        labels = _fill_empty(points, labels, w, gamma, k)
        previous = np.inf
        for _ in range(max_iter):
            w, gamma = _refit(points, labels, k)
            labels, objective = _assign(points, w, gamma)
            labels = _fill_empty(points, labels, w, gamma, k)
            if objective >= previous - 1e-12:
                break
            previous = objective
        objective = assignment_objective(points, labels, k)
        if objective < best_objective:
            best_objective = objective
            best_labels = labels.copy()
    return best_labels


@numba.njit(cache=True)
def assignment_objective(points, labels, k):
    """Exact k-HC2 cost of an assignment: the sum over clusters of the smallest scatter eigenvalue."""
    total = 0.0
    for j in range(k):
        total += _fit_plane(points, labels == j)[2]
    return total


def canonical_labels(labels: np.ndarray) -> np.ndarray:
    """Relabel clusters in order of first appearance, so point i sits in a cluster <= i (the model's symmetry
    breaking x_ij = 0 for i < j)."""
    mapping: dict[int, int] = {}
    return np.array([mapping.setdefault(int(label), len(mapping)) for label in labels], dtype=np.int64)


def fit_assignment(points: np.ndarray, labels: np.ndarray, k: int) -> PlaneFit:
    """The optimal hyperplanes of a fixed assignment (per-cluster total least squares)."""
    points = np.ascontiguousarray(points, dtype=np.float64)
    labels = np.ascontiguousarray(labels, dtype=np.int64)
    w, gamma = _refit(points, labels, k)
    return PlaneFit(w=w, gamma=gamma, labels=labels, objective=float(assignment_objective(points, labels, k)))


def k_planes(points: np.ndarray, k: int, restarts: int = 100, max_iter: int = 100, seed: int = 0) -> PlaneFit:
    """Best of `restarts` runs of alternating k-planes from random planes; labels in canonical order."""
    points = np.ascontiguousarray(points, dtype=np.float64)
    labels = _k_planes_restarts(points, k, restarts, max_iter, seed)
    return fit_assignment(points, canonical_labels(labels), k)
