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

import time
from dataclasses import dataclass

import numpy as np

from toolkit.cluster.config import KhcConfig, KhcGenerateConfig
from toolkit.cluster.khc_data import check_instance, load_points, planted_instance
from toolkit.cluster.khc_heuristic import (
    PlaneFit,
    canonical_labels,
    fit_assignment,
    k_planes,
)
from toolkit.cluster.khc_model import FORMULATIONS, add_warm_start, build_model, model_size, spread_order
from toolkit.core.errors import RunError, require
from toolkit.core.records import write_json

__all__ = ["FORMULATIONS", "KhcConfig", "KhcGenerateConfig", "KhcResult", "load_points", "plan", "run", "run_generate",
           "solve"]



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
    write_json(ctx.path("solution.json"), solution)
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
    write_json(ctx.path("planted.json"), planted)
    ctx.metrics.update(n=config.n, d=config.d, k=config.k, outliers=int((inst.labels < 0).sum()))
    return planted

