"""Influence power: the paper's worked examples, closed forms, UCT vs enumeration, fitting, bad graphs."""

import itertools
import math

import numpy as np
import pytest

from toolkit.causal.influence import (
    auf_probability,
    average_causal_effect,
    build_model,
    check_graph,
    fit_cpts,
    influence_exact,
    influence_mcts,
    paper_examples,
    sample,
)
from toolkit.core.errors import BadInputError

EXAMPLES = {e["name"]: e for e in paper_examples()}


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_paper_examples_exact(name):
    ex = EXAMPLES[name]
    result = influence_exact(ex["model"], ex["variable"])
    assert round(result["inp"], 3) == ex["expected"]
    assert round(average_causal_effect(ex["model"], ex["variable"]), 3) == ex["expected_ace"]


def test_example2_terms_and_latent_must_be_summed_out():
    model = EXAMPLES["example2"]["model"]
    result = influence_exact(model, "W")
    assert result["alter"]["1"] == pytest.approx(0.68) and result["observe"] == pytest.approx(0.518)
    # observing the latent gene makes the skin test useless (paper: p(W | U = u) = 0 for both u)
    for u in (0, 1):
        assert influence_exact(model, "W", {"U": u})["inp"] == pytest.approx(0.0, abs=1e-12)


def _noise_enumeration_example4(do_x=None):
    """Independent reference: P(Y=1 | do(Z=z), history) by brute force over the four Bernoulli noises."""
    table = []
    for nu, nx, nz, ny in itertools.product((0, 1), repeat=4):
        weight = (0.5) * (0.9 if nx else 0.1) * (0.9 if nz else 0.1) * (0.4 if ny else 0.6)
        u = nu
        x = u * nx + (1 - u) * (1 - nx) if do_x is None else do_x
        table.append((weight, u, x, nz, ny))
    return table


def test_example4_against_noise_enumeration():
    # observe X, then pick the best Z per observed x: closed form from enumerating noises
    def p_y(rows, z):
        num = sum(w * (z * (1 - u) + (1 - z) * ny) for w, u, x, nz, ny in rows)
        return num / sum(w for w, *_ in rows)

    rows = _noise_enumeration_example4()
    observe = 0.0
    for x in (0, 1):
        sub = [r for r in rows if r[2] == x]
        observe += sum(r[0] for r in sub) * max(p_y(sub, 0), p_y(sub, 1))
    alter = max(max(p_y(_noise_enumeration_example4(x), 0), p_y(_noise_enumeration_example4(x), 1)) for x in (0, 1))
    assert influence_exact(EXAMPLES["example4"]["model"], "X")["inp"] == pytest.approx(alter - observe)


def test_single_variable_reduces_to_eq6():
    # one actionable parent: p = max_v P(Y|do v) - P(Y) (Eq. 6)
    spec = {"target": "Y", "desired": [1], "variables": [
        {"name": "A", "role": "actionable", "cpt": [0.7, 0.3]},
        {"name": "Y", "parents": ["A"], "cpt": {"0": [0.8, 0.2], "1": [0.1, 0.9]}}]}
    model = build_model(spec)
    expected = 0.9 - (0.7 * 0.2 + 0.3 * 0.9)
    assert influence_exact(model, "A")["inp"] == pytest.approx(expected)
    assert auf_probability(model, ()) == pytest.approx(0.7 * 0.2 + 0.3 * 0.9)


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_mcts_within_002_and_same_decision(name):
    ex = EXAMPLES[name]
    exact = influence_exact(ex["model"], ex["variable"])
    for seed in (0, 1):
        est = influence_mcts(ex["model"], ex["variable"], 2000, seed=seed)
        assert abs(est["inp"] - exact["inp"]) <= 0.02
        assert est["decision"] == exact["decision"]


def test_mcts_mean_backup_converges_slowly_but_ranks():
    ex = EXAMPLES["example2"]
    est = influence_mcts(ex["model"], "W", 4000, seed=0, backup="mean")
    assert est["inp"] > 0 and est["decision"] == "alter to 1"


def test_fitted_from_observations_close_to_truth(tmp_path):
    model = EXAMPLES["example2"]["model"]
    rows = sample(model, 20000, seed=0)
    path = tmp_path / "obs.csv"
    path.write_text("U,W,X,Z,Y\n" + "\n".join(",".join(str(r[k]) for k in "UWXZY") for r in rows))
    spec = {"target": "Y", "desired": [1], "variables": [
        {"name": "U", "role": "latent"}, {"name": "W", "role": "actionable"},
        {"name": "X", "parents": ["U", "W"], "role": "actionable"}, {"name": "Z", "role": "actionable"},
        {"name": "Y", "parents": ["Z", "U"]}]}
    cpts, n = fit_cpts(spec, str(path), smoothing=1.0)
    assert n == 20000
    np.testing.assert_allclose(cpts["U"], model.variables[0].cpt, atol=0.02)
    fitted = build_model(spec, cpts)
    assert influence_exact(fitted, "W")["inp"] == pytest.approx(0.162, abs=0.03)


def test_cycle_unknown_and_order_errors():
    with pytest.raises(BadInputError, match="cyclic"):
        check_graph(["A", "B", "Y"], {"A": ["B"], "B": ["A"], "Y": ["A"]})
    with pytest.raises(BadInputError, match="unknown variable 'Q'"):
        check_graph(["A", "Y"], {"A": [], "Y": ["Q"]})
    with pytest.raises(BadInputError, match="topological"):
        check_graph(["Y", "A"], {"Y": ["A"], "A": []})
    model = EXAMPLES["example1"]["model"]
    with pytest.raises(BadInputError, match="unknown variable"):
        influence_exact(model, "nope")
    with pytest.raises(BadInputError, match="not actionable|target"):
        influence_exact(model, "Y")


def test_bad_cpt_rows():
    spec = {"target": "Y", "desired": [1], "variables": [
        {"name": "A", "role": "actionable", "cpt": [0.7, 0.7]}, {"name": "Y", "parents": ["A"],
                                                                 "cpt": {"0": [0.5, 0.5], "1": [0.5, 0.5]}}]}
    with pytest.raises(BadInputError, match="sum to 1"):
        build_model(spec)
    spec["variables"][0]["cpt"] = [0.5, 0.5]
    del spec["variables"][1]["cpt"]["1"]
    with pytest.raises(BadInputError, match="misses"):
        build_model(spec)
    spec["variables"][1]["cpt"] = {"0": [0.5, 0.5], "1": [math.nan, 1.0]}
    with pytest.raises(BadInputError, match="finite"):
        build_model(spec)
