"""FAME: Formal Abstract Minimal Explanations (Boumazouza, Elsaleh, Ducoffe, Bassan, Katz).

Paper: https://arxiv.org/abs/2603.10661 (OpenReview VJkNqJJAhV); official code: https://github.com/ducoffeM/FAME
(Keras 3 + decomon). This is an independent torch port built on our own CROWN (toolkit/explain/crown.py).

An explanation E keeps pixels at their value; the complement F ranges over the eps-box. FAME grows F by
  1. batch freeing: CROWN bounds on Omega_m(x; F) for every m = 1..|remaining| in one batch; in each row a 0/1
     multi-dimensional knapsack over the linear bound's per-feature costs picks up to m more pixels whose joint
     worst case keeps every margin f_i - f_c < 0 (Prop. 4.2); the row freeing most wins; repeat with the smaller
     domain while anything is freed (iterative refinement);
  2. a singleton phase: the pixels freeable one at a time on the plain box, freed by binary search;
and measures the distance to a true minimal explanation with attacks that prove pixels necessary.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from toolkit.explain.config import FameConfig
from toolkit.explain.crown import (
    Domain,
    box_domains,
    cardinality_domains,
    certified,
    feature_slack,
    margin_spec,
    spec_bounds,
)
from toolkit.explain.net import AffineNet


@dataclass
class FameTrace:
    free: torch.Tensor  # (P,) bool: pixels freed; the explanation is the complement
    rounds: list = field(default_factory=list)  # pixels freed by each batch round
    singleton_freed: int = 0


def greedy_knapsack(cost: torch.Tensor, capacity: torch.Tensor, m: int) -> torch.Tensor:
    """Indices (columns of cost) of the longest prefix, in ascending order of max_i cost_ij / capacity_i, whose
    every row sum stays strictly below capacity; at most m. cost (S, N) >= 0, capacity (S,) > 0."""
    normalised = cost / capacity[:, None]
    order = normalised.amax(0).argsort()
    within = (normalised[:, order].cumsum(1) < 1).all(0)
    prefix = int(within.long().cumprod(0).sum())
    return order[:min(prefix, m)]


def exact_knapsack(cost: torch.Tensor, capacity: torch.Tensor, m: int) -> torch.Tensor:
    """max sum y s.t. cost @ y < capacity (rowwise, with a tiny safety margin), sum y <= m, y in {0,1} (SCIP)."""
    from pyscipopt import Model, quicksum

    model = Model()
    model.hideOutput()
    picks = [model.addVar(vtype="B") for _ in range(cost.shape[1])]
    for row, cap in zip(cost.tolist(), capacity.tolist()):
        model.addCons(quicksum(c * y for c, y in zip(row, picks) if c != 0) <= cap * (1 - 1e-9))
    model.addCons(quicksum(picks) <= m)
    model.setObjective(quicksum(picks), "maximize")
    model.optimize()
    chosen = [j for j, y in enumerate(picks) if model.getVal(y) > 0.5]
    chosen = torch.tensor(chosen, dtype=torch.long)
    return chosen if bool((cost[:, chosen].sum(1) < capacity).all()) else greedy_knapsack(cost, capacity, m)


def free_at_once(domain: Domain, row: int, coeffs: torch.Tensor, offset: torch.Tensor, upper: torch.Tensor,
                 knapsack: str) -> torch.Tensor:
    """Pixels (indices) freeable on top of row's free set, certified by row's linear bound on Omega_m."""
    m = int(domain.m[row])
    candidates = domain.candidate[row].nonzero().flatten()
    single = domain.rows(torch.tensor([row]))
    cost = feature_slack(single, coeffs[None])[0]  # (S, P) worst-case rise of each margin per freed pixel
    worst_bias = coeffs @ domain.center + offset + (cost * domain.free[row]).sum(-1)
    cost = cost[:, candidates]
    if bool((upper < 0).all()):  # any m candidates are safe: prefer the cheapest ones
        return candidates[cost.amax(0).argsort()[:m]]
    if bool((worst_bias >= 0).any()):
        return candidates[:0]
    solve = exact_knapsack if knapsack == "exact" else greedy_knapsack
    return candidates[solve(cost, -worst_bias, m)]


def batch_round(net: AffineNet, x0, lower, upper, free: torch.Tensor, label: int, knapsack: str) -> torch.Tensor:
    """One round of batch freeing over every cardinality m at once; returns the best row's new pixels."""
    remaining = int((~free).sum())
    domain = cardinality_domains(net, x0, lower, upper, free, torch.arange(1, remaining + 1))
    bounds = spec_bounds(net, domain, margin_spec(net.n_classes, label), "crown")
    best = free.nonzero().flatten()[:0]
    for row in range(domain.batch):
        chosen = free_at_once(domain, row, bounds.coeffs[row], bounds.offset[row], bounds.upper[row], knapsack)
        if len(chosen) > len(best):
            best = chosen
    return best


def singleton_phase(net: AffineNet, x0, lower, upper, free: torch.Tensor, label: int, method: str) -> torch.Tensor:
    """Free the pixels certifiable one at a time (on the plain box), by recursive halving of that set."""
    remaining = (~free).nonzero().flatten()
    if len(remaining) == 0:
        return free
    rows = free.expand(len(remaining), -1).clone()
    rows[torch.arange(len(remaining)), remaining] = True
    ok = certified(net, box_domains(net, x0, lower, upper, rows), label, method)

    def release(group: torch.Tensor, current: torch.Tensor) -> torch.Tensor:
        if len(group) == 0:
            return current
        trial = current.clone()
        trial[group] = True
        if bool(certified(net, box_domains(net, x0, lower, upper, trial[None]), label, method)[0]):
            return trial
        if len(group) == 1:
            return current
        half = len(group) // 2
        return release(group[half:], release(group[:half], current))

    return release(remaining[ok], free)


def fame_explain(net: AffineNet, x0: torch.Tensor, lower: torch.Tensor, upper: torch.Tensor, label: int,
                 knapsack: str = "greedy", refine_domain: bool = True, singleton: bool = True,
                 bound_method: str = "crown") -> FameTrace:
    """The FAME explanation of `label` at x0 on the box [lower, upper]: returns the freed pixels."""
    trace = FameTrace(free=torch.zeros(net.n_features, dtype=torch.bool))
    while bound_method == "crown" and not bool(trace.free.all()):
        chosen = batch_round(net, x0, lower, upper, trace.free, label, knapsack)
        if len(chosen) == 0:
            break
        trace.free[chosen] = True
        trace.rounds.append(len(chosen))
        if not refine_domain:
            break
    if singleton:
        before = int(trace.free.sum())
        trace.free = singleton_phase(net, x0, lower, upper, trace.free, label, bound_method)
        trace.singleton_freed = int(trace.free.sum()) - before
    return trace


def run(config: FameConfig, ctx) -> dict:
    from toolkit.explain.formal_runs import explain_images

    def explain(net, sample):
        trace = fame_explain(net, sample.x0, sample.lower, sample.upper, sample.label, config.knapsack,
                             config.refine_domain, config.singleton_phase, config.bound_method)
        return trace.free, {"freed_per_round": trace.rounds, "freed_by_singleton_phase": trace.singleton_freed}

    return explain_images(config, ctx, "fame", explain, refine=config.refine)
