"""The k-HC2 MINLP in SCIP: the paper's formulations (inf-norm / 1-norm normalisation), our tightenings
(cluster order, data big-M), model sizes, and the heuristic warm start.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from toolkit.cluster.config import Formulation  # noqa: F401 - declared once, with the config
from toolkit.cluster.khc_data import Box
from toolkit.cluster.khc_heuristic import (
    PlaneFit,
    canonical_labels,
    fit_assignment,
)
from toolkit.core.errors import require

FORMULATIONS: tuple[str, ...] = ("plain", "one", "inf", "multi")
NORM_BRANCH_PRIORITY = 100  # branch on u/s before x (Props 3-4: the norm binaries decide the bound)

# ---------------------------------------------------------------------------------------------------- model

@dataclass
class KhcModel:
    """A pyscipopt model of one formulation and handles to its variables (arrays of pyscipopt Variables)."""

    model: object
    formulation: str
    x: np.ndarray
    dist: np.ndarray
    w: np.ndarray
    gamma: np.ndarray
    t: object
    box: Box
    u: np.ndarray | None = None
    s: np.ndarray | None = None
    w_plus: np.ndarray | None = None
    w_minus: np.ndarray | None = None


# long: one MI-QCQP, its variables and constraints declared in the paper's order; split, each piece would need
# every variable
def build_model(points: np.ndarray, k: int, formulation: str, *, relax: bool = False,
                norm_branch_priority: bool = True, tighten: bool = False) -> KhcModel:
    """The MI-QCQP of `formulation` on `points` (original coordinates; translated inside).

    relax=True builds the convex relaxation studied in Props 2-4 instead: binaries continuous in [0, 1] and the
    nonconvex ||w_j||_2^2 >= 1 replaced by its concave envelope over the box, which is vacuous (w = 0 stays
    feasible), so only the polyhedral norm constraints keep w away from 0.
    """
    from pyscipopt import Model, quicksum

    require(formulation in FORMULATIONS, f"unknown formulation '{formulation}'", f"use one of {FORMULATIONS}")
    box = Box.of(points)
    a = points - box.shift
    n, d = a.shape
    binary = "C" if relax else "B"
    model = Model("khc-" + formulation)
    model.hideOutput()
    sign_symmetry = formulation in ("plain", "one")
    x = np.array([[model.addVar(f"x_{i}_{j}", vtype=binary, lb=0, ub=1 if j <= i else 0) for j in range(k)]
                  for i in range(n)])  # x_ij = 0 for i < j (1-based): assignment symmetry
    big_m = data_big_m(a) if tighten else np.full(n, box.d_upper)
    dist = np.array([model.addVar(f"d_{i}", lb=0, ub=big_m[i]) for i in range(n)])
    w = np.array([[model.addVar(f"w_{j}_{h}", lb=0 if (h == 0 and sign_symmetry) else -1, ub=1) for h in range(d)]
                  for j in range(k)])
    gamma_bound = float(np.linalg.norm(a, axis=1).max()) if tighten else d * box.b + box.d_upper
    gamma = np.array([model.addVar(f"gamma_{j}", lb=-gamma_bound, ub=gamma_bound) for j in range(k)])
    t = model.addVar("t", lb=0, ub=n * box.d_upper ** 2)
    model.setObjective(t, "minimize")
    model.addCons(t >= quicksum(dist[i] * dist[i] for i in range(n)), "epigraph")
    for i in range(n):
        model.addCons(quicksum(x[i]) == 1, f"assign_{i}")
        for j in range(min(i + 1, k)):
            residual = quicksum(float(a[i, h]) * w[j, h] for h in range(d)) - gamma[j]
            model.addCons(dist[i] >= residual - big_m[i] * (1 - x[i, j]), f"above_{i}_{j}")
            model.addCons(dist[i] >= -residual - big_m[i] * (1 - x[i, j]), f"below_{i}_{j}")
    if tighten:
        _add_cluster_order(model, x, d)
        if not relax:  # assign the points in their (spread) order: early decisions already bound the cost
            for i in range(n):
                for j in range(min(i + 1, k)):
                    model.chgVarBranchPriority(x[i, j], n - i)
    if not relax:
        for j in range(k):
            model.addCons(quicksum(w[j, h] * w[j, h] for h in range(d)) >= 1, f"norm2_{j}")
    if tighten:  # some optimum has unit normals, so the convex ball keeps it and confines w near the sphere
        for j in range(k):
            model.addCons(quicksum(w[j, h] * w[j, h] for h in range(d)) <= 1, f"ball_{j}")
    handles = KhcModel(model=model, formulation=formulation, x=x, dist=dist, w=w, gamma=gamma, t=t, box=box)
    if formulation in ("inf", "multi"):
        _add_inf_norm(model, handles, binary)
    if formulation in ("one", "multi"):
        _add_one_norm(model, handles, binary, fix_first_sign=sign_symmetry)
    if norm_branch_priority and not relax:
        for var in [*(handles.u.ravel() if handles.u is not None else []),
                    *(handles.s.ravel() if handles.s is not None else [])]:
            model.chgVarBranchPriority(var, NORM_BRANCH_PRIORITY + n if tighten else NORM_BRANCH_PRIORITY)
    return handles


def spread_order(points: np.ndarray) -> np.ndarray:
    """Farthest-first order: the point farthest from the centroid, then repeatedly the point farthest from those
    already taken. Numbering the points so (with the symmetry breaking) puts spread-out points into the first
    branching decisions, where d + 1 of them in one cluster already force a nonzero bound."""
    taken = [int(np.argmax(np.linalg.norm(points - points.mean(axis=0), axis=1)))]
    gap = np.linalg.norm(points - points[taken[0]], axis=1)
    gap[taken[0]] = -np.inf
    for _ in range(len(points) - 1):
        taken.append(int(np.argmax(gap)))
        gap = np.minimum(gap, np.linalg.norm(points - points[taken[-1]], axis=1))
        gap[taken] = -np.inf
    return np.array(taken)


def data_big_m(a: np.ndarray) -> np.ndarray:
    """Per-point big-M max_l ||a_i - a_l||_2: a unit-normal plane through its cluster's centroid (some optimum
    has one) lies within that distance of every point, since the centroid is in the points' convex hull."""
    return np.sqrt(((a[:, None, :] - a[None, :, :]) ** 2).sum(axis=2)).max(axis=1)


def _add_cluster_order(model, x: np.ndarray, d: int) -> None:
    """Orbitopal symmetry breaking and cluster sizes, both kept by some optimum:
    - clusters numbered by their first point: x_ij <= sum_{l<i} x_l,j-1 (removes all k! relabellings; the
      paper's x_ij = 0 for i < j removes only part of them);
    - every cluster has >= d points when n >= k d (else >= 1): a cluster with fewer can take a point from one
      with more than d, staying at cost 0 (d points lie on a hyperplane) without raising the donor's cost."""
    from pyscipopt import quicksum

    n, k = x.shape
    for j in range(1, k):
        for i in range(j, n):
            model.addCons(x[i, j] <= quicksum(x[l, j - 1] for l in range(i)), f"order_{i}_{j}")
    size = d if n >= k * d else 1
    for j in range(k):
        model.addCons(quicksum(x[:, j]) >= size, f"size_{j}")


def _add_inf_norm(model, h: KhcModel, binary: str) -> None:
    """||w_j||_inf >= 1/sqrt(d) as one-sided disjunction: some component w_jh >= 1/sqrt(d) (u_jh = 1)."""
    from pyscipopt import quicksum

    k, d = h.w.shape
    h.u = np.array([[model.addVar(f"u_{j}_{c}", vtype=binary, lb=0, ub=1) for c in range(d)] for j in range(k)])
    for j in range(k):
        model.addCons(quicksum(h.u[j]) == 1, f"inf_pick_{j}")
        for c in range(d):
            model.addCons(h.w[j, c] >= -1 + (1 + 1 / math.sqrt(d)) * h.u[j, c], f"inf_{j}_{c}")


def _add_one_norm(model, h: KhcModel, binary: str, fix_first_sign: bool) -> None:
    """||w_j||_1 >= 1 with w = w+ - w-; s_jh picks the sign of w_jh. With w_j1 >= 0 kept, s_j1 = 1."""
    from pyscipopt import quicksum

    k, d = h.w.shape
    h.s = np.array([[model.addVar(f"s_{j}_{c}", vtype=binary, lb=1 if (fix_first_sign and c == 0) else 0, ub=1)
                     for c in range(d)] for j in range(k)])
    h.w_plus = np.array([[model.addVar(f"wp_{j}_{c}", lb=0, ub=1) for c in range(d)] for j in range(k)])
    h.w_minus = np.array([[model.addVar(f"wm_{j}_{c}", lb=0, ub=1) for c in range(d)] for j in range(k)])
    for j in range(k):
        model.addCons(quicksum(h.w_plus[j]) + quicksum(h.w_minus[j]) >= 1, f"one_{j}")
        for c in range(d):
            model.addCons(h.w[j, c] == h.w_plus[j, c] - h.w_minus[j, c], f"split_{j}_{c}")
            model.addCons(h.w_plus[j, c] <= h.s[j, c], f"plus_{j}_{c}")
            model.addCons(h.w_minus[j, c] <= 1 - h.s[j, c], f"minus_{j}_{c}")


def model_size(n: int, d: int, k: int, formulation: str, tighten: bool = False) -> dict:
    """Variables and constraints of the model build_model makes, without building it (for --dry-run)."""
    free_x = sum(min(i + 1, k) for i in range(n))  # the others are fixed to 0 by the assignment symmetry breaking
    has_inf, has_one = formulation in ("inf", "multi"), formulation in ("one", "multi")
    order_constraints = sum(n - j for j in range(1, k)) + k if tighten else 0
    return {"binary_vars": n * k + k * d * (has_inf + has_one), "binaries_fixed_by_symmetry": n * k - free_x,
            "continuous_vars": n + k * d + k + 1 + 2 * k * d * has_one,
            "linear_constraints": n + 2 * free_x + (k + k * d) * has_inf + (k + 3 * k * d) * has_one
                                  + order_constraints,
            "nonconvex_quadratic_constraints": k, "convex_quadratic_constraints": 1 + k * tighten,
            "plain_nodes_before_nonzero_bound_at_least": 2 ** (k * (d - 1))}


# ---------------------------------------------------------------------------------------------------- warm start

def oriented_normal(w: np.ndarray, formulation: str) -> np.ndarray:
    """Flip a unit normal into the model's feasible orientation: w_1 >= 0 (plain/one) or a largest component
    positive (inf/multi: the one-sided disjunction needs some w_h >= 1/sqrt d)."""
    if formulation in ("plain", "one"):
        return -w if w[0] < 0 else w
    return -w if w[np.argmax(np.abs(w))] < 0 else w


def add_warm_start(h: KhcModel, points: np.ndarray, fit: PlaneFit) -> bool:
    """Give SCIP the heuristic solution as an incumbent; returns whether SCIP accepted it."""
    a = points - h.box.shift
    k = h.w.shape[0]
    labels = canonical_labels(fit.labels)
    fit = fit_assignment(points, labels, k)
    normals = np.array([oriented_normal(fit.w[j], h.formulation) / np.linalg.norm(fit.w[j]) for j in range(k)])
    normals *= 1 + 1e-9  # strictly inside ||w||_2 >= 1 despite rounding
    centres = np.array([a[labels == j].mean(axis=0) if (labels == j).any() else a.max(axis=0) / 2 for j in range(k)])
    gammas = np.einsum("kd,kd->k", normals, centres)
    dist = np.abs(np.einsum("nd,nd->n", a, normals[labels]) - gammas[labels])
    model = h.model
    sol = model.createSol()
    pairs = [(h.t, float(dist @ dist) * (1 + 1e-9)), *zip(h.dist, dist), *zip(h.gamma, gammas),
             *zip(h.w.ravel(), normals.ravel()), *zip(h.x.ravel(), np.eye(k)[labels].ravel())]
    if h.u is not None:
        pairs += zip(h.u.ravel(), np.eye(a.shape[1])[np.argmax(normals, axis=1)].ravel())
    if h.s is not None:
        pairs += [*zip(h.s.ravel(), (normals >= 0).ravel().astype(float)),
                  *zip(h.w_plus.ravel(), np.maximum(normals, 0).ravel()),
                  *zip(h.w_minus.ravel(), np.maximum(-normals, 0).ravel())]
    for var, value in pairs:
        model.setSolVal(sol, var, float(value))
    return bool(model.addSol(sol, free=True))
