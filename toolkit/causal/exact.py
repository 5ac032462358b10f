"""Exact influence power: the MEP recursion, Eqs. (3)-(4), InP (Definition 1), and the ACE baseline.
"""

from __future__ import annotations

import math

from toolkit.causal.model import CausalModel, History, auf_probability, choices, conditional, decision_sequence
from toolkit.core.errors import require


# --------------------------------------------------------------------------------------------- exact
def mep(model: CausalModel, sequence: list[int], history: History, memo: dict) -> float:
    """Eqs. (3)-(4): best of altering or observing each remaining decision variable; at the end Eq. (12)."""
    if not sequence:
        return auf_probability(model, history)
    key = (len(sequence), history)
    if key in memo:
        return memo[key]
    var, rest = sequence[0], sequence[1:]
    best = -math.inf
    for choice in choices(model, var):
        best = max(best, _choice_value(model, var, choice, rest, history, memo))
    memo[key] = best
    return best


def _choice_value(model, var, choice, rest, history, memo) -> float:
    if choice is not None:
        return mep(model, rest, history + ((var, "do", choice),), memo)
    probs = conditional(model, var, history)
    return float(sum(p * mep(model, rest, history + ((var, "see", v),), memo)
                     for v, p in enumerate(probs) if p > 0))


def given_history(model: CausalModel, var: int, given: dict) -> History:
    history = []
    for name, value in given.items():
        index = model.index(name)
        require(index < var, f"conditioning variable '{name}' must come before '{model.variables[var].name}' "
                             "in the decision order")
        history.append((index, "see", model.value_index(index, value)))
    return tuple(sorted(history))


def check_measurable(model: CausalModel, name: str) -> int:
    var = model.index(name)
    require(var != model.target, f"'{name}' is the target; influence power is measured for actionable variables")
    require(model.variables[var].role == "actionable", f"'{name}' is {model.variables[var].role}, not actionable")
    return var


def influence_exact(model: CausalModel, name: str, given: dict | None = None) -> dict:
    """Definition 1 by exhaustive enumeration: per-alteration MEP, observe MEP, InP and the best choice."""
    var = check_measurable(model, name)
    history = given_history(model, var, given or {})
    rest, memo = decision_sequence(model, var), {}
    values = {c: _choice_value(model, var, c, rest, history, memo) for c in choices(model, var)}
    return summarise(model, var, values)


def summarise(model: CausalModel, var: int, values: dict) -> dict:
    domain = model.variables[var].domain
    alter = {str(domain[c]): round(float(v), 12) for c, v in values.items() if c is not None}
    best = max(alter, key=alter.get)
    observe = round(float(values[None]), 12)
    inp = round(alter[best] - observe, 12)
    return {"inp": inp + 0.0, "alter": alter, "observe": observe,
            "decision": f"alter to {best}" if inp > 0 else "observe"}



# --------------------------------------------------------------------------------------------- ACE
def average_causal_effect(model: CausalModel, name: str) -> float:
    """τ = P(Y∈S | do(V = last value)) − P(Y∈S | do(V = first value)); the usual ACE for binary domains."""
    var = model.index(name)
    last = len(model.variables[var].domain) - 1
    return round(auf_probability(model, ((var, "do", last),)) - auf_probability(model, ((var, "do", 0),)), 12) + 0.0
