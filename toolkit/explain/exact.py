"""Exact sufficiency check of an explanation: a MILP with the big-M ReLU encoding (Tjeng et al. 2019) in SCIP.

The explanation is sufficient iff max over the box of the free features of max_{i != c} f_i(x) - f_c(x) < 0.
Big-M constants are CROWN's pre-activation bounds on the same domain (sound), so stable neurons need no binary.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from toolkit.explain.crown import box_domains, margin_spec, spec_bounds
from toolkit.explain.net import AffineNet

TOLERANCE = 1e-6  # SCIP's feasibility tolerance: margins within it are read as "not flipped"


@dataclass
class ExactResult:
    robust: bool | None  # None: the solver hit its time limit without deciding
    worst_margin: float  # best max_{i != c} f_i - f_c found (a true point when robust is False)
    witness: torch.Tensor | None  # a counterexample input when robust is False


def _encode(model, net: AffineNet, x0, lower, upper, free_inputs, pre_bounds):
    """Add input and hidden variables; returns the expressions of the last hidden layer's outputs."""
    from pyscipopt import quicksum

    inputs = [model.addVar(lb=float(lower[j]), ub=float(upper[j]), name=f"x{j}") if free_inputs[j] else float(x0[j])
              for j in range(net.n_inputs)]
    layer_in = inputs
    for k, (lo_k, hi_k) in enumerate(pre_bounds):
        weight, bias = net.weights[k].tolist(), net.biases[k].tolist()
        lows, highs = lo_k[0].tolist(), hi_k[0].tolist()
        out = []
        for unit, row in enumerate(weight):
            lo, hi = lows[unit], highs[unit]
            if hi <= 0:
                out.append(0.0)
                continue
            z = quicksum(w * v for w, v in zip(row, layer_in) if w != 0 and not isinstance(v, float))
            z = z + bias[unit] + sum(w * v for w, v in zip(row, layer_in) if isinstance(v, float))
            h = model.addVar(lb=max(lo, 0.0), ub=hi, name=f"h{k}_{unit}")
            if lo >= 0:
                model.addCons(h == z)
            else:
                gate = model.addVar(vtype="B", name=f"d{k}_{unit}")
                model.addCons(h >= z)
                model.addCons(h <= z - lo * (1 - gate))
                model.addCons(h <= hi * gate)
            out.append(h)
        layer_in = out
    return inputs, layer_in


def exact_check(net: AffineNet, x0: torch.Tensor, lower: torch.Tensor, upper: torch.Tensor, free: torch.Tensor,
                label: int, time_limit: float = 60.0) -> ExactResult:
    """Decide whether freeing the pixels in `free` (P,) over [lower, upper] can change the argmax away from label."""
    from pyscipopt import Model, quicksum

    domain = box_domains(net, x0, lower, upper, free.reshape(1, -1))
    spec = margin_spec(net.n_classes, label)
    bounds = spec_bounds(net, domain, spec, "crown")
    open_rows = [s for s in range(spec.shape[0]) if bounds.upper[0, s] >= 0]
    if not open_rows:
        return ExactResult(True, float(bounds.upper.max()), None)
    free_inputs = free.reshape(-1)[net.feature_of_input()].tolist()
    model = Model()
    model.hideOutput()
    model.setParam("limits/time", time_limit)
    inputs, hidden = _encode(model, net, x0, lower, upper, free_inputs, bounds.pre_bounds)
    last_w, last_b = net.weights[-1], net.biases[-1]
    undecided, worst, witness = False, -float("inf"), None
    for s in open_rows:
        row_w, row_b = (spec[s] @ last_w).tolist(), float(spec[s] @ last_b)
        terms = list(zip(row_w, hidden))  # hidden is the input layer itself for a purely linear net
        objective = quicksum(w * v for w, v in terms if not isinstance(v, float)) + row_b + \
            sum(w * v for w, v in terms if isinstance(v, float))
        model.freeTransform()
        model.setObjective(objective, "maximize")
        model.optimize()
        status = model.getStatus()
        if model.getNSols() > 0:
            solution = model.getBestSol()
            point = torch.tensor([model.getSolVal(solution, v) if not isinstance(v, float) else v for v in inputs],
                                 dtype=torch.float64).clamp(lower, upper)
            margin = float((net(point) @ spec.T).max())
            worst = max(worst, margin)
            if margin > 0:
                witness = point
        if witness is not None:
            return ExactResult(False, worst, witness)
        bound = model.getDualbound() if status != "optimal" else model.getObjVal()
        if bound > TOLERANCE:
            undecided = True
    return ExactResult(None if undecided else True, worst, None)
