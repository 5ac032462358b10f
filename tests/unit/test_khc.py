"""k-HC2 math against independent references: brute-force enumeration of assignments with per-cluster total least
squares (numpy eigvalsh), SVD plane fits, and the paper's lower-bound statements (Props 2-4)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from toolkit.cluster.khc import solve
from toolkit.cluster.khc_data import check_instance, planted_instance
from toolkit.cluster.khc_heuristic import canonical_labels, fit_assignment, k_planes
from toolkit.cluster.khc_model import FORMULATIONS, build_model, data_big_m, model_size, spread_order
from toolkit.core.errors import BadInputError


def brute_force(points: np.ndarray, k: int) -> float:
    """min over all k^n assignments of sum_j (smallest eigenvalue of cluster j's centred scatter)."""
    best = np.inf
    for labels in itertools.product(range(k), repeat=len(points)):
        labels = np.array(labels)
        cost = 0.0
        for j in range(k):
            members = points[labels == j]
            if len(members) > 1:
                centred = members - members.mean(axis=0)
                cost += max(np.linalg.eigvalsh(centred.T @ centred)[0], 0.0)
        best = min(best, cost)
    return best


TINY = [(6, 2, 2, 11), (7, 2, 3, 5), (7, 3, 2, 7)]  # (n, d, k, seed): n > k d so the optimum is not 0


@pytest.fixture(scope="module")
def tiny_optima():
    out = {}
    for n, d, k, seed in TINY:
        points = planted_instance(n, d, k, noise=0.01, seed=seed).points
        out[(n, d, k, seed)] = (points, brute_force(points, k))
    return out


@pytest.mark.parametrize("formulation", FORMULATIONS)
@pytest.mark.parametrize("case", TINY, ids=[f"n{n}d{d}k{k}" for n, d, k, _ in TINY])
def test_proven_optimum_equals_brute_force(tiny_optima, case, formulation):
    points, optimum = tiny_optima[case]
    assert optimum > 1e-6
    result = solve(points, case[2], formulation, time_limit=60, warm_start=False, restarts=5)
    assert result.status == "optimal"
    assert result.objective == pytest.approx(optimum, rel=1e-6, abs=1e-9)
    # SCIP's own values are exact only up to its absolute feasibility tolerance (1e-6) on t >= sum d_i^2
    assert result.solver_objective == pytest.approx(optimum, abs=2e-6)
    assert result.dual_bound <= optimum + 2e-6


@pytest.mark.parametrize("formulation", ["plain", "inf"])
@pytest.mark.parametrize("case", TINY, ids=[f"n{n}d{d}k{k}" for n, d, k, _ in TINY])
def test_tightened_model_keeps_the_brute_force_optimum(tiny_optima, case, formulation):
    """--tighten cuts solutions away (big-M, ball, orbitope, cluster sizes >= d: all active since n >= k d here)
    and renumbers the points; the proven optimum must still be the enumerated one."""
    points, optimum = tiny_optima[case]
    assert len(points) >= case[1] * case[2]
    result = solve(points, case[2], formulation, time_limit=60, warm_start=False, restarts=5, tighten=True)
    assert result.status == "optimal"
    assert result.objective == pytest.approx(optimum, rel=1e-6, abs=1e-9)
    assert result.solver_objective == pytest.approx(optimum, abs=2e-6)


def test_data_big_m_covers_every_residual_of_centroid_planes():
    """Any assignment's total-least-squares planes (unit normal through the centroid, via numpy SVD) lie within
    max_l ||a_i - a_l|| of every point a_i: the premise of the tightened big-M."""
    rng = np.random.default_rng(4)
    points = planted_instance(15, 3, 3, seed=4).points
    big_m = data_big_m(points)
    for _ in range(50):
        labels = rng.integers(0, 3, len(points))
        for j in range(3):
            members = points[labels == j]
            if len(members) < 2:
                continue
            centre = members.mean(axis=0)
            normal = np.linalg.svd(members - centre)[2][-1]
            assert (np.abs((points - centre) @ normal) <= big_m + 1e-12).all()


def test_spread_order_is_a_farthest_first_permutation():
    points = np.random.default_rng(1).normal(size=(12, 2))
    order = spread_order(points)
    assert sorted(order) == list(range(12))
    assert order[0] == np.argmax(np.linalg.norm(points - points.mean(axis=0), axis=1))
    for step in range(1, 12):
        gaps = np.linalg.norm(points[:, None] - points[order[:step]][None], axis=2).min(axis=1)
        assert gaps[order[step]] == pytest.approx(np.delete(gaps, order[:step]).max())


@pytest.mark.parametrize("case", TINY, ids=[f"n{n}d{d}k{k}" for n, d, k, _ in TINY])
def test_heuristic_is_an_upper_bound_with_the_exact_cost_of_its_assignment(tiny_optima, case):
    points, optimum = tiny_optima[case]
    fit = k_planes(points, case[2], restarts=30, seed=1)
    assert fit.objective >= optimum - 1e-12
    distances = np.abs(np.einsum("nd,nd->n", points, fit.w[fit.labels]) - fit.gamma[fit.labels])
    assert fit.objective == pytest.approx(float(distances @ distances), rel=1e-9, abs=1e-12)
    assert np.allclose(np.linalg.norm(fit.w, axis=1), 1.0)


def test_plane_fit_matches_svd_total_least_squares():
    rng = np.random.default_rng(0)
    points = rng.normal(size=(12, 3))
    labels = np.array([0] * 7 + [1] * 5)
    fit = fit_assignment(points, labels, 2)
    for j in range(2):
        members = points[labels == j]
        centred = members - members.mean(axis=0)
        normal = np.linalg.svd(centred)[2][-1]
        assert abs(abs(fit.w[j] @ normal) - 1) < 1e-8
        assert fit.gamma[j] == pytest.approx(fit.w[j] @ members.mean(axis=0))
    assert fit.objective == pytest.approx(sum(np.linalg.svd(points[labels == j] - points[labels == j].mean(axis=0),
                                                            compute_uv=False)[-1] ** 2 for j in range(2)))


def test_canonical_labels_respect_assignment_symmetry_breaking():
    labels = canonical_labels(np.array([2, 2, 0, 1, 0]))
    assert labels.tolist() == [0, 0, 1, 2, 1]
    assert all(labels[i] <= i for i in range(len(labels)))


def test_planted_instance_lies_near_its_planes():
    inst = planted_instance(40, 3, 2, noise=1e-4, outlier_fraction=0.1, seed=4)
    inliers = inst.labels >= 0
    residual = np.einsum("nd,nd->n", inst.points[inliers], inst.w[inst.labels[inliers]]) - inst.gamma[inst.labels[inliers]]
    assert np.abs(residual).max() < 0.05
    assert (~inliers).sum() == 4
    assert np.allclose(np.linalg.norm(inst.w, axis=1), 1.0)


@pytest.mark.parametrize("tighten", [False, True])
@pytest.mark.parametrize("formulation", FORMULATIONS)
def test_model_size_matches_the_built_model(formulation, tighten):
    points = planted_instance(7, 3, 2, seed=0).points
    handles = build_model(points, 2, formulation, tighten=tighten)
    size = model_size(7, 3, 2, formulation, tighten)
    variables = handles.model.getVars()
    assert len(variables) == size["binary_vars"] + size["continuous_vars"]
    assert sum(v.vtype() == "BINARY" for v in variables) == size["binary_vars"]
    quadratic = size["nonconvex_quadratic_constraints"] + size["convex_quadratic_constraints"]
    assert handles.model.getNConss() == size["linear_constraints"] + quadratic


def _relaxation_bound(points, k, formulation, labels=None, fix=None):
    """Optimal value of the convex relaxation (binaries continuous, ||w||_2 >= 1 dropped) with some fixings."""
    handles = build_model(points, k, formulation, relax=True)
    model = handles.model
    if labels is not None:
        for i, row in enumerate(handles.x):
            for j, var in enumerate(row):
                value = float(labels[i] == j)
                model.chgVarLb(var, value)
                model.chgVarUb(var, value)
    for var, value in (fix or {}).items():
        model.chgVarLb(getattr(handles, var[0])[var[1]], value)
        model.chgVarUb(getattr(handles, var[0])[var[1]], value)
    model.optimize()
    assert model.getStatus() == "optimal"
    return model.getObjVal()


@pytest.fixture(scope="module")
def bound_instance():
    inst = planted_instance(10, 2, 2, noise=0.01, seed=3)
    return inst.points, canonical_labels(k_planes(inst.points, 2, restarts=10).labels)


def test_root_relaxation_is_zero_for_every_formulation(bound_instance):
    points, _ = bound_instance
    for formulation in FORMULATIONS:
        assert _relaxation_bound(points, 2, formulation) == pytest.approx(0, abs=1e-7)


def test_plain_bound_stays_zero_even_with_the_assignment_fixed(bound_instance):
    """Prop 2: without norm cuts, w = 0 stays feasible until spatial branching has split the w box."""
    points, labels = bound_instance
    assert _relaxation_bound(points, 2, "plain", labels) == pytest.approx(0, abs=1e-7)


@pytest.mark.parametrize("formulation,binary", [("inf", "u"), ("one", "s"), ("multi", "u")])
def test_fixing_the_norm_binaries_gives_a_nonzero_bound(bound_instance, formulation, binary):
    """Props 3-4: once the norm binaries of every plane are fixed (k(d-1) branchings for u), w is bounded away
    from 0 and the bound is positive at every leaf; only the sign/component choice is branched on."""
    points, labels = bound_instance
    d = points.shape[1]
    for choice in itertools.product(range(d), repeat=2):
        fix = {(binary, (j, c)): float(c == choice[j]) for j in range(2) for c in range(d)}
        if formulation == "one":  # s_j1 = 1 is fixed by the sign symmetry; the leaves pick the other signs
            fix = {(binary, (j, c)): float(c == 0 or choice[j] == 0) for j in range(2) for c in range(d)}
        assert _relaxation_bound(points, 2, formulation, labels, fix) > 1e-6


@pytest.mark.parametrize("k,shape,message", [
    (0, (10, 2), "k must be >= 1"), (11, (10, 2), "exceeds the number of points"), (2, (10, 1), "d = 1"),
])
def test_check_instance_rejects_bad_problems(k, shape, message):
    with pytest.raises(BadInputError, match=message):
        check_instance(np.random.default_rng(0).normal(size=shape), k)


def test_check_instance_rejects_constant_data():
    with pytest.raises(BadInputError, match="identical"):
        check_instance(np.ones((6, 2)), 2)


def test_solve_controls(tiny_optima):
    points, optimum = tiny_optima[TINY[0]]
    assert solve(points, 2, "inf", node_limit=1, warm_start=False, restarts=1).status == "nodelimit"
    loose = solve(points, 2, "inf", gap=10.0, restarts=20)
    assert loose.status in ("gaplimit", "optimal") and loose.objective >= optimum - 1e-12
    concurrent = solve(points, 2, "inf", threads=2, restarts=5)
    assert concurrent.status == "optimal" and concurrent.objective == pytest.approx(optimum, rel=1e-6)


@pytest.mark.parametrize("n,d,k,seed", [(20, 3, 2, 10), (30, 2, 3, 1), (24, 3, 3, 2)])
def test_heuristic_recovers_noiseless_planted_planes(n, d, k, seed):
    """Points exactly on k planes: the planted assignment costs 0, so the heuristic must reach ~0. (On the noisy
    version of the first case, 100 starts from random assignments stalled at 15x the optimum.)"""
    inst = planted_instance(n, d, k, noise=0.0, seed=seed)
    assert k_planes(inst.points, k, restarts=100, seed=0).objective < 1e-12
