"""FAME, VeriX, the MILP and the attacks against an independent exact oracle: LP over every ReLU pattern."""

import itertools

import pytest
import torch
from scipy.optimize import linprog
from torch import nn

from toolkit.explain.attacks import necessary_features
from toolkit.explain.crown import epsilon_box, margin_spec
from toolkit.explain.exact import exact_check
from toolkit.explain.fame import exact_knapsack, fame_explain, greedy_knapsack
from toolkit.explain.net import to_affine_net
from toolkit.explain.verix import verix_explain

EPS = 0.3


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tiny_net():
    """6 pixels, hidden 4-4 (8 ReLUs: at most 256 activation patterns), 3 classes; weights large enough that
    explanations are neither empty nor everything at EPS."""
    torch.manual_seed(5)
    model = nn.Sequential(nn.Flatten(), nn.Linear(6, 4), nn.ReLU(), nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 3))
    for parameter in model.parameters():
        if parameter.dim() == 2:
            nn.init.normal_(parameter, std=1.5)
    return to_affine_net(model, (1, 2, 3))


def possible_patterns(net, lower, upper):
    """ReLU on/off patterns not excluded by plain interval arithmetic (stable neurons have one choice)."""
    choices, lo, hi = [], lower, upper
    for weight, bias in zip(net.weights[:-1], net.biases[:-1]):
        mid, rad = (lo + hi) / 2, (hi - lo) / 2
        pre_lo, pre_hi = weight @ mid + bias - weight.abs() @ rad, weight @ mid + bias + weight.abs() @ rad
        choices += [(1,) if a >= 0 else (0,) if b <= 0 else (0, 1) for a, b in zip(pre_lo.tolist(), pre_hi.tolist())]
        lo, hi = pre_lo.clamp(min=0), pre_hi.clamp(min=0)
    return itertools.product(*choices)


def lp_max_margin(net, x0, lower, upper, free, label) -> float:
    """max_{i != c} f_i - f_c over the box of the free pixels, by one LP per ReLU pattern (exact, slow)."""
    coords = free[net.feature_of_input()]
    box_lo, box_hi = torch.where(coords, lower, x0), torch.where(coords, upper, x0)
    bounds = [(float(lower[j]), float(upper[j])) if coords[j] else (float(x0[j]), float(x0[j])) for j in range(6)]
    widths = [w.shape[0] for w in net.weights[:-1]]
    spec = margin_spec(net.n_classes, label)
    best = -float("inf")
    for pattern in possible_patterns(net, box_lo, box_hi):
        rows, rhs = [], []
        lin_w, lin_b = torch.eye(6, dtype=torch.float64), torch.zeros(6, dtype=torch.float64)
        offset = 0
        for k, width in enumerate(widths):
            pre_w, pre_b = net.weights[k] @ lin_w, net.weights[k] @ lin_b + net.biases[k]
            gate = torch.tensor(pattern[offset:offset + width], dtype=torch.float64)
            sign = 1 - 2 * gate  # active: -pre <= 0; inactive: pre <= 0
            rows.append(sign[:, None] * pre_w)
            rhs.append(-sign * pre_b)
            lin_w, lin_b = gate[:, None] * pre_w, gate * pre_b
            offset += width
        a_ub, b_ub = torch.cat(rows).numpy(), torch.cat(rhs).numpy()
        out_w, out_b = spec @ net.weights[-1] @ lin_w, spec @ (net.weights[-1] @ lin_b + net.biases[-1])
        for s in range(spec.shape[0]):
            result = linprog(-out_w[s].numpy(), A_ub=a_ub, b_ub=b_ub, bounds=bounds, method="highs")
            if result.status == 0:
                best = max(best, -result.fun + float(out_b[s]))
    return best


def points(net, seed=2, count=6):
    generator = torch.Generator().manual_seed(seed)
    return [torch.rand(net.n_inputs, generator=generator, dtype=torch.float64) for _ in range(count)]


def test_greedy_knapsack_is_feasible_and_within_the_optimum():
    generator = torch.Generator().manual_seed(0)
    for _ in range(30):
        cost = torch.rand(3, 7, generator=generator, dtype=torch.float64)
        capacity = torch.rand(3, generator=generator, dtype=torch.float64) * 2 + 0.1
        m = int(torch.randint(1, 8, (1,), generator=generator))
        best = max(len(c) for k in range(m + 1) for c in itertools.combinations(range(7), k)
                   if bool((cost[:, list(c)].sum(1) < capacity).all()))
        greedy = greedy_knapsack(cost, capacity, m)
        exact = exact_knapsack(cost, capacity, m)
        assert len(greedy) <= best and bool((cost[:, greedy].sum(1) < capacity).all())
        assert len(exact) == best and bool((cost[:, exact].sum(1) < capacity).all())


def test_milp_agrees_with_pattern_enumeration(tiny_net):
    generator = torch.Generator().manual_seed(1)
    verdicts = set()
    for x0 in points(tiny_net):
        lower, upper = epsilon_box(x0, EPS)
        free = torch.rand(6, generator=generator) < 0.6
        label = int(tiny_net(x0).argmax())
        truth = lp_max_margin(tiny_net, x0, lower, upper, free, label)
        result = exact_check(tiny_net, x0, lower, upper, free, label)
        assert result.robust == (truth < 0)
        verdicts.add(result.robust)
        if result.robust is False:
            assert result.worst_margin == pytest.approx(truth, abs=1e-5)
    assert verdicts == {True, False}


@pytest.mark.parametrize("knapsack", ["greedy", "exact"])
def test_every_fame_explanation_is_sufficient(tiny_net, knapsack):
    sizes = []
    for x0 in points(tiny_net):
        lower, upper = epsilon_box(x0, EPS)
        label = int(tiny_net(x0).argmax())
        free = fame_explain(tiny_net, x0, lower, upper, label, knapsack=knapsack).free
        assert lp_max_margin(tiny_net, x0, lower, upper, free, label) < 0
        assert exact_check(tiny_net, x0, lower, upper, free, label).robust is True
        sizes.append(int((~free).sum()))
    assert max(sizes) >= 3 and min(sizes) == 0  # the cases are not all trivial


def test_verix_explanations_sufficient_and_exact_oracle_minimal(tiny_net):
    for x0 in points(tiny_net):
        lower, upper = epsilon_box(x0, EPS)
        label = int(tiny_net(x0).argmax())
        for oracle in ("crown", "exact"):
            free = verix_explain(tiny_net, x0, lower, upper, label, oracle=oracle)
            assert lp_max_margin(tiny_net, x0, lower, upper, free, label) < 0
        for pixel in (~free).nonzero().flatten().tolist():  # exact oracle: no kept pixel can be dropped
            more = free.clone()
            more[pixel] = True
            assert lp_max_margin(tiny_net, x0, lower, upper, more, label) >= 0


def test_attack_lower_bound_brackets_the_minimal_explanation(tiny_net):
    """size_min <= |smallest sufficient subset of E| <= |E|, by enumerating every subset of the explanation."""
    proven = 0
    for x0 in points(tiny_net):
        lower, upper = epsilon_box(x0, EPS)
        label = int(tiny_net(x0).argmax())
        free = fame_explain(tiny_net, x0, lower, upper, label).free
        necessary = necessary_features(tiny_net, x0, lower, upper, free, label, "pgd", 30, 3)
        proven += int(necessary.sum())
        assert not bool((necessary & free).any())
        for pixel in necessary.nonzero().flatten().tolist():
            more = free.clone()
            more[pixel] = True
            assert exact_check(tiny_net, x0, lower, upper, more, label).robust is False
        kept = (~free).nonzero().flatten().tolist()
        smallest = min(len(kept) - len(drop) for k in range(len(kept) + 1) for drop in itertools.combinations(kept, k)
                       if exact_check(tiny_net, x0, lower, upper, free.index_fill(0, torch.tensor(drop, dtype=torch.long), True),
                                      label).robust)
        assert int(necessary.sum()) <= smallest <= len(kept)
    assert proven >= 3  # the attack does prove some pixels necessary
