"""k-HC2: 2-norm k-hyperplane clustering solved to proven global optimality with SCIP (spatial branch-and-bound).

Paper: S. Coniglio, "Solving the 2-norm k-hyperplane clustering problem via multi-norm formulations", ICLR 2026,
https://openreview.net/forum?id=VJAqqtVXfD — official code (Gurobi): https://github.com/stefanoconiglio/khc-multinorm

Given n points a_i in R^d, find k hyperplanes {x : w_j.x = gamma_j} minimising the sum of squared Euclidean
distances of every point to its closest hyperplane. The MI-QCQP k-HC(2,1) (paper §4.2) reads

    min sum_i d_i^2   s.t.  sum_j x_ij = 1,  ||w_j||_2^2 >= 1  (the only nonconvexity),
                            d_i >= +-(w_j.a_i - gamma_j) - dU (1 - x_ij),
                            -1 <= w_jh <= 1,  |gamma_j| <= d b + dU,  x_ij = 0 for i < j,  w_j1 >= 0,

on points translated to >= 0 (b = edge of the smallest enclosing hypercube, dU = b sqrt(d)). The strengthenings
add valid polyhedral norm constraints implied by ||w||_2 >= 1 that give spatial B&B nonzero bounds early:

    inf   (1, 1/sqrt(d)):  ||w_j||_inf >= 1/sqrt(d) as the one-sided disjunction w_jh >= -1 + (1 + 1/sqrt(d)) u_jh,
                           sum_h u_jh = 1 (w_j1 >= 0 dropped: it contradicts the one-sided disjunction);
    one   (inf, 1):        ||w_j||_1 >= 1 with w = w+ - w-, w+ <= s, w- <= 1 - s, sum (w+ + w-) >= 1;
    multi:                 both sets, w_j1 >= 0 dropped.

`tighten` (ours, not in the paper; valid because some optimal solution satisfies all of it: unit normals, planes
through their cluster's centroid, clusters numbered by their first point, no cluster below d points): per-point
big-M max_l ||a_i - a_l||, |gamma_j| <= max_l ||a_l||, the convex ball ||w_j||_2 <= 1, orbitopal symmetry
breaking x_ij <= sum_{l<i} x_l,j-1, cluster sizes >= d, and the points numbered farthest-first with the
assignment branched on in that order.

SCIP takes only linear objectives, so sum d_i^2 moves into the epigraph constraint t >= sum d_i^2.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import Field

from toolkit.cluster.khc_heuristic import (
    PlaneFit,
    canonical_labels,
    fit_assignment,
    k_planes,
)
from toolkit.core.config import BaseConfig
from toolkit.core.errors import BadInputError, RunError, require

Formulation = Literal["plain", "one", "inf", "multi"]
FORMULATIONS: tuple[str, ...] = ("plain", "one", "inf", "multi")
NORM_BRANCH_PRIORITY = 100  # branch on u/s before x (Props 3-4: the norm binaries decide the bound)


class KhcConfig(BaseConfig):
    """`iclrkit cluster khc solve`: k-HC2 to proven optimality (SCIP) or by the k-planes heuristic alone."""

    data: str                                  # points: .csv (one row per point, optional header) or .npy (n x d)
    k: int = 2                                 # number of hyperplanes, 1 <= k <= n (checked against the data)
    formulation: Formulation = "inf"           # plain = k-HC(2,1); inf = (1, 1/sqrt d); one = (inf, 1); multi = both
    heuristic_only: bool = False               # skip SCIP; report the best k-planes solution
    time_limit: float = Field(600.0, gt=0)     # seconds (SCIP limits/time)
    gap: float = Field(0.0, ge=0)              # stop at this relative primal-dual gap (limits/gap); 0 = prove optimum
    node_limit: int = Field(-1, ge=-1)         # B&B node limit (limits/nodes); -1 = none
    threads: int = Field(1, ge=1)              # > 1 runs SCIP's concurrent solver (racing settings)
    restarts: int = Field(100, ge=1)           # k-planes restarts for the warm start / upper bound
    warm_start: bool = True                    # hand the heuristic solution to SCIP as incumbent (a cutoff)
    norm_branch_priority: bool = True          # branch on the norm binaries u/s first (Prop 4)
    tighten: bool = False                      # ours, beyond the paper: data big-M, ||w||_2 <= 1, orbitopal
                                               # symmetry breaking, cluster sizes, spread point order (see
                                               # build_model); valid (keeps an optimum), often fewer nodes
    plot: bool = True                          # write plot.png for d = 2 or 3


class KhcGenerateConfig(BaseConfig):
    """`iclrkit cluster khc generate`: planted instance (paper §5 generator) with noise and outliers."""

    n: int = 30                                # points
    d: int = 2                                 # dimension
    k: int = 3                                 # planted hyperplanes
    noise: float = 0.003                       # max orthogonal noise variance; each plane draws U[0.7 noise, noise]
    outlier_fraction: float = 0.0              # share of points replaced by uniform points in the bounding box
    format: Literal["csv", "npy"] = "csv"


# ---------------------------------------------------------------------------------------------------- data

def load_points(path: str) -> np.ndarray:
    """n x d float array from .csv/.npy; rejects missing files, ragged or non-numeric rows, NaN/inf."""
    file = Path(path)
    require(file.is_file(), f"data file not found: {path}")
    if file.suffix.lower() == ".npy":
        try:
            points = np.load(file, allow_pickle=False)
        except (ValueError, OSError) as exc:
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


# ---------------------------------------------------------------------------------------------------- solve

@dataclass
class KhcResult:
    status: str
    objective: float          # exact k-HC2 cost of the returned assignment (per-cluster total least squares)
    solver_objective: float   # SCIP's primal value (t); equals objective up to SCIP's feasibility tolerance
    dual_bound: float
    gap: float
    nodes: int
    seconds: float
    fit: PlaneFit             # hyperplanes in the original coordinates
    heuristic_objective: float


def set_limits(model, *, time_limit: float, gap: float, node_limit: int, seed: int) -> None:
    model.setParam("limits/time", float(time_limit))  # a real parameter: ints are rejected
    model.setParam("limits/gap", float(gap))
    model.setParam("limits/nodes", int(node_limit))
    model.setParam("randomization/randomseedshift", int(seed) % 2**31)


def solve(points: np.ndarray, k: int, formulation: str = "inf", *, time_limit: float = 600.0, gap: float = 0.0,
          node_limit: int = -1, threads: int = 1, restarts: int = 100, warm_start: bool = True,
          norm_branch_priority: bool = True, tighten: bool = False, seed: int = 0) -> KhcResult:
    """Solve k-HC2 with the chosen formulation; the k-planes heuristic supplies the incumbent."""
    check_instance(points, k)
    started = time.perf_counter()
    heuristic = k_planes(points, k, restarts=restarts, seed=seed)
    order = spread_order(points) if tighten else np.arange(len(points))
    h = build_model(points[order], k, formulation, norm_branch_priority=norm_branch_priority, tighten=tighten)
    set_limits(h.model, time_limit=time_limit, gap=gap, node_limit=node_limit, seed=seed)
    if warm_start:
        add_warm_start(h, points[order], PlaneFit(heuristic.w, heuristic.gamma, heuristic.labels[order],
                                                  heuristic.objective))
    if threads > 1:
        h.model.setParam("parallel/maxnthreads", int(threads))
        h.model.solveConcurrent()
    else:
        h.model.optimize()
    model = h.model
    if model.getNSols() == 0:
        raise RunError(f"SCIP found no solution (status {model.getStatus()})", "raise the time limit or warm-start")
    best = model.getBestSol()
    labels = np.empty(len(points), dtype=np.int64)
    labels[order] = [int(np.argmax([model.getSolVal(best, v) for v in row])) for row in h.x]
    labels = canonical_labels(labels)
    fit = fit_assignment(points, labels, k)
    if heuristic.objective < fit.objective:  # SCIP stopped early on a worse incumbent than the heuristic's
        fit = heuristic
    return KhcResult(status=model.getStatus(), objective=fit.objective, solver_objective=model.getObjVal(),
                     dual_bound=model.getDualbound(), gap=model.getGap(), nodes=model.getNTotalNodes(),
                     seconds=time.perf_counter() - started, fit=fit, heuristic_objective=heuristic.objective)


def hyperplanes_json(fit: PlaneFit) -> list[dict]:
    """Each plane with its largest normal component made positive (w and -w describe the same plane)."""
    planes = []
    for j in range(len(fit.gamma)):
        sign = 1.0 if fit.w[j][np.argmax(np.abs(fit.w[j]))] >= 0 else -1.0
        planes.append({"w": (sign * fit.w[j]).tolist(), "gamma": sign * float(fit.gamma[j]),
                       "size": int((fit.labels == j).sum())})
    return planes


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


# ---------------------------------------------------------------------------------------------------- run

def plan(config: KhcConfig, ctx) -> dict:
    points = load_points(config.data)
    check_instance(points, config.k)
    n, d = points.shape
    return {"n": n, "d": d, "k": config.k, "formulation": config.formulation,
            "model": model_size(n, d, config.k, config.formulation, config.tighten),
            "guidance": "proven optima in minutes are typical up to n ~ 60, d <= 3, k <= 3 with inf/multi; "
                        "beyond that expect time limits (the result is then the best solution and a bound)"}


def run(config: KhcConfig, ctx) -> dict:
    points = load_points(config.data)
    check_instance(points, config.k)
    if config.heuristic_only:
        started = time.perf_counter()
        fit = k_planes(points, config.k, restarts=config.restarts, seed=ctx.seed)
        metrics = {"status": "heuristic", "objective": fit.objective, "seconds": time.perf_counter() - started}
    else:
        result = solve(points, config.k, config.formulation, time_limit=config.time_limit, gap=config.gap,
                       node_limit=config.node_limit, threads=config.threads, restarts=config.restarts,
                       warm_start=config.warm_start, norm_branch_priority=config.norm_branch_priority,
                       tighten=config.tighten,
                       seed=ctx.seed)
        fit = result.fit
        metrics = {"status": result.status, "objective": result.objective,
                   "solver_objective": result.solver_objective, "dual_bound": result.dual_bound,
                   "gap": result.gap, "nodes": result.nodes, "seconds": result.seconds,
                   "heuristic_objective": result.heuristic_objective,
                   "heuristic_gap": _relative_gap(result.heuristic_objective, result.objective)}
    metrics.update(n=int(points.shape[0]), d=int(points.shape[1]), k=config.k)
    solution = {**metrics, "formulation": None if config.heuristic_only else config.formulation,
                "hyperplanes": hyperplanes_json(fit), "labels": fit.labels.tolist()}
    ctx.path("solution.json").write_text(json.dumps(solution, indent=2))
    np.savetxt(ctx.path("assignments.csv"), fit.labels, fmt="%d", header="cluster", comments="")
    if config.plot and points.shape[1] in (2, 3):
        from toolkit.cluster.khc_plot import plot_solution

        plot_solution(points, fit, ctx.path("plot.png"), title=f"k-HC2 k={config.k}: {metrics['status']}, "
                                                              f"SSD {fit.objective:.4g}")
    ctx.inputs["data"] = config.data
    ctx.metrics.update(metrics)
    return solution


def _relative_gap(upper: float, optimum: float) -> float:
    return (upper - optimum) / max(abs(optimum), 1e-12)


def run_generate(config: KhcGenerateConfig, ctx) -> dict:
    require(config.n >= 1 and config.d >= 1 and config.k >= 1, "n, d and k must all be >= 1")
    require(config.noise >= 0, f"noise must be >= 0, got {config.noise}")
    require(0 <= config.outlier_fraction < 1, f"outlier_fraction must be in [0, 1), got {config.outlier_fraction}")
    inst = planted_instance(config.n, config.d, config.k, config.noise, config.outlier_fraction, seed=ctx.seed)
    if config.format == "npy":
        np.save(ctx.path("points.npy"), inst.points)
    else:
        header = ",".join(f"x{c}" for c in range(config.d))
        np.savetxt(ctx.path("points.csv"), inst.points, delimiter=",", header=header, comments="", fmt="%.10g")
    planted = {"labels": inst.labels.tolist(), "hyperplanes": [{"w": inst.w[j].tolist(), "gamma": float(inst.gamma[j])}
                                                               for j in range(config.k)]}
    ctx.path("planted.json").write_text(json.dumps(planted, indent=2))
    ctx.metrics.update(n=config.n, d=config.d, k=config.k, outliers=int((inst.labels < 0).sum()))
    return planted
