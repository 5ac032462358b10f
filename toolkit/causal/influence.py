"""Influence power (InP) of actionable variables for avoiding an undesired future (`iclrkit causal influence`).

Paper: Tao, Wang, Jiang, Zhou, "On Measuring Influence in Avoiding Undesired Future" (ICLR 2026),
https://openreview.net/forum?id=VHdF91MvJq. No official code ("Code: TBD"); Rehearsal-LAMDA/Rehearsal-Kit has a
related implementation (enumeration over bins, not the paper's MCTS) — read to compare, nothing copied.

The model is a discrete causal Bayesian network listed in a topological (= decision) order V_1..V_d, Y. Each
variable is `actionable` (may be altered to a value in its action set, or observed), `observed` (observed only)
or `latent` (never available at decision time: always summed out). The AUF probability under alterations A and
observations O is Eq. (12): the truncated factorisation with the altered factors replaced by point masses,
conditioned on O, all other variables summed out. MEP is the max-expected-utility recursion Eqs. (3)-(4) over the
variables after the one measured, and InP is Definition 1: max_v MEP(V_i := v) - E_{v~P(V_i)} MEP(V_i = v).
"""

from __future__ import annotations

import csv
import itertools
import json
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import Field

from toolkit.core.config import BaseConfig
from toolkit.core.errors import BadInputError, require

Role = Literal["actionable", "observed", "latent"]
ROLES = ("actionable", "observed", "latent")


class InfluenceConfig(BaseConfig):
    """Influence power by exact enumeration and by the paper's UCT estimator (α = √2)."""

    sem: str = Field(description="Model spec (.yaml/.json with variables, parents, CPTs, roles) or example:1..4.")
    data: str | None = Field(None, description="Observational CSV: CPTs are fitted on it (Eq. 10) instead of "
                                                  "read from the spec, which then only needs the graph.")
    variables: list[str] | None = Field(None, description="Actionable variables to measure (default: all).")
    given: dict[str, str | int] = Field({}, description="Conditional InP: values observed before the decision.")
    method: Literal["exact", "mcts", "both"] = Field("both", description="exact enumeration, UCT, or both.")
    iterations: int = Field(2000, ge=1, description="UCT iterations per variable.")
    alpha: float = Field(math.sqrt(2), ge=0, description="UCT exploration constant (paper: √2).")
    backup: Literal["max", "mean"] = Field("max", description="How UCT root values are read: Bellman backup over "
                                                              "the tree, or the plain averages of Eq. (9).")
    smoothing: float = Field(1.0, ge=0, description="Laplace pseudo-count when fitting CPTs on --data.")
    max_joint_size: int = Field(5_000_000, ge=1, description="Refuse models whose joint table is larger.")


# --------------------------------------------------------------------------------------------- the model
@dataclass(frozen=True)
class Variable:
    name: str
    domain: tuple
    parents: tuple[int, ...]  # indices of earlier variables
    cpt: np.ndarray  # shape (*parent domain sizes, own domain size); rows sum to 1
    role: Role
    actions: tuple[int, ...]  # indices into domain; empty unless actionable


@dataclass
class CausalModel:
    """Variables in decision order; the last one is the target Y with desired set `desired` (domain indices)."""

    variables: list[Variable]
    desired: frozenset[int]

    def __post_init__(self):
        self._joint_cache: dict = {}

    @property
    def names(self) -> list[str]:
        return [v.name for v in self.variables]

    @property
    def target(self) -> int:
        return len(self.variables) - 1

    def index(self, name: str) -> int:
        require(name in self.names, f"unknown variable '{name}'", f"known: {', '.join(self.names)}")
        return self.names.index(name)

    def value_index(self, var: int, value) -> int:
        domain = self.variables[var].domain
        for i, item in enumerate(domain):
            if str(item) == str(value):
                return i
        raise BadInputError(f"value {value!r} is not in the domain {list(domain)} of '{self.variables[var].name}'")

    def joint(self, alterations: tuple[tuple[int, int], ...]) -> np.ndarray:
        """P(V, Y | Â) of Eq. (11) as a dense table (altered factors are point masses)."""
        key = tuple(sorted(alterations))
        if key not in self._joint_cache:
            altered = dict(key)
            sizes = [len(v.domain) for v in self.variables]
            table = np.ones(sizes)
            for i, var in enumerate(self.variables):
                if i in altered:
                    factor = np.zeros(sizes[i])
                    factor[altered[i]] = 1.0
                    table = table * factor.reshape([sizes[i] if a == i else 1 for a in range(len(sizes))])
                else:
                    table = table * _broadcast(var.cpt, (*var.parents, i), sizes)
            self._joint_cache[key] = table
        return self._joint_cache[key]


def _broadcast(cpt: np.ndarray, axes: tuple[int, ...], sizes: list[int]) -> np.ndarray:
    order = np.argsort(axes)
    moved = cpt.transpose(order)
    sorted_axes = [axes[i] for i in order]
    return moved.reshape([sizes[a] if a in sorted_axes else 1 for a in range(len(sizes))])


# --------------------------------------------------------------------------------------------- Eq. (12)
History = tuple  # ((var, "do"|"see", value_index), ...)


def _sliced(model: CausalModel, history: History) -> np.ndarray:
    alterations = tuple((var, value) for var, kind, value in history if kind == "do")
    table = model.joint(alterations)
    index = [slice(None)] * len(model.variables)
    for var, kind, value in history:
        if kind == "see":
            index[var] = value
    # keep every axis (slices of length 1) so axis numbers stay valid
    return table[tuple(slice(i, i + 1) if isinstance(i, int) else i for i in index)]


def auf_probability(model: CausalModel, history: History) -> float:
    """P(Y ∈ S | Â, O), Eq. (12): unobserved variables (latent ones included) are summed out."""
    table = _sliced(model, history)
    marginal_y = table.sum(axis=tuple(range(model.target))).reshape(-1)
    total = marginal_y.sum()
    require(total > 0, "the observed history has probability zero under the model")
    return float(marginal_y[sorted(model.desired)].sum() / total)


def conditional(model: CausalModel, var: int, history: History) -> np.ndarray:
    """P(V_var | Â, O) for the next variable in the sequence."""
    table = _sliced(model, history)
    axes = tuple(a for a in range(len(model.variables)) if a != var)
    marginal = table.sum(axis=axes).reshape(-1)
    total = marginal.sum()
    require(total > 0, "the observed history has probability zero under the model")
    return marginal / total


def choices(model: CausalModel, var: int) -> list:
    """Alterations first (domain indices), then None = observe; latent variables offer neither."""
    spec = model.variables[var]
    if spec.role == "latent":
        return []
    return [*spec.actions, None] if spec.role == "actionable" else [None]


def decision_sequence(model: CausalModel, start: int) -> list[int]:
    """Variables after `start` at which a choice is made; latent ones are skipped (summed out)."""
    return [i for i in range(start + 1, model.target) if model.variables[i].role != "latent"]


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


def _given_history(model: CausalModel, var: int, given: dict) -> History:
    history = []
    for name, value in given.items():
        index = model.index(name)
        require(index < var, f"conditioning variable '{name}' must come before '{model.variables[var].name}' "
                             "in the decision order")
        history.append((index, "see", model.value_index(index, value)))
    return tuple(sorted(history))


def _check_measurable(model: CausalModel, name: str) -> int:
    var = model.index(name)
    require(var != model.target, f"'{name}' is the target; influence power is measured for actionable variables")
    require(model.variables[var].role == "actionable", f"'{name}' is {model.variables[var].role}, not actionable")
    return var


def influence_exact(model: CausalModel, name: str, given: dict | None = None) -> dict:
    """Definition 1 by exhaustive enumeration: per-alteration MEP, observe MEP, InP and the best choice."""
    var = _check_measurable(model, name)
    history = _given_history(model, var, given or {})
    rest, memo = decision_sequence(model, var), {}
    values = {c: _choice_value(model, var, c, rest, history, memo) for c in choices(model, var)}
    return _summary(model, var, values)


def _summary(model: CausalModel, var: int, values: dict) -> dict:
    domain = model.variables[var].domain
    alter = {str(domain[c]): round(float(v), 12) for c, v in values.items() if c is not None}
    best = max(alter, key=alter.get)
    observe = round(float(values[None]), 12)
    inp = round(alter[best] - observe, 12)
    return {"inp": inp + 0.0, "alter": alter, "observe": observe,
            "decision": f"alter to {best}" if inp > 0 else "observe"}


# --------------------------------------------------------------------------------------------- UCT
def influence_mcts(model: CausalModel, name: str, iterations: int, alpha: float = math.sqrt(2), seed: int = 0,
                   given: dict | None = None, backup: str = "max") -> dict:
    """The paper's estimator (Sec. 4.1): UCT over alter/observe choices with Eq. (8) selection, expansion of one
    untried choice, a random playout and the exact AUF probability (Eq. 12) at the terminal.

    The root's per-choice values are read from the tree either as the plain averages of Eq. (9)
    (`backup="mean"`), which include every exploratory branch and so sit below the MEP of suboptimal root
    choices for a long time with α = √2, or by the Bellman backup over the same tree (`backup="max"`): max over
    tried choices at decision nodes, observed outcomes weighted by P(v | history), exact values at terminals."""
    var = _check_measurable(model, name)
    require(iterations >= len(choices(model, var)), f"UCT needs at least {len(choices(model, var))} iterations "
                                                    f"to try every root choice of '{name}'")
    search = _Search(model, [var, *decision_sequence(model, var)], alpha, random.Random(seed))
    root: History = _given_history(model, var, given or {})
    for _ in range(iterations):
        search.iterate(root)
    edges = search.edges[(0, root)]
    values = {c: (search.choice_value(0, root, c) if backup == "max" else edge.total / edge.visits)
              for c, edge in edges.items() if edge.visits}
    result = _summary(model, var, values)
    result["visits"] = {("observe" if c is None else str(model.variables[var].domain[c])): e.visits
                        for c, e in edges.items()}
    return result


@dataclass
class _Edge:
    visits: int = 0
    total: float = 0.0
    outcomes: dict | None = None  # observed value -> count, for the observe choice


class _Search:
    """UCT statistics keyed by (depth, history); depth indexes the decision sequence."""

    def __init__(self, model: CausalModel, sequence: list[int], alpha: float, rng: random.Random):
        self.model, self.sequence, self.alpha, self.rng = model, sequence, alpha, rng
        self.edges: dict = {}
        self.node_totals: dict = {}
        self.distributions: dict = {}

    def step(self, depth: int, history: History, choice) -> History:
        var = self.sequence[depth]
        if choice is not None:
            return history + ((var, "do", choice),)
        key = (var, history)
        if key not in self.distributions:
            self.distributions[key] = conditional(self.model, var, history)
        probs = self.distributions[key]
        return history + ((var, "see", self.rng.choices(range(len(probs)), weights=probs)[0]),)

    def playout(self, depth: int, history: History) -> float:
        while depth < len(self.sequence):
            history = self.step(depth, history, self.rng.choice(choices(self.model, self.sequence[depth])))
            depth += 1
        return auf_probability(self.model, history)

    def iterate(self, root: History) -> None:
        depth, history, path, nodes = 0, root, [], []
        while depth < len(self.sequence):
            node = self.edges.setdefault((depth, history), {c: _Edge(outcomes={} if c is None else None)
                                                            for c in choices(self.model, self.sequence[depth])})
            untried = [c for c, edge in node.items() if edge.visits == 0]
            if untried:
                choice = self.rng.choice(untried)
            else:
                log_visits = math.log(sum(edge.visits for edge in node.values()))
                choice = max(node, key=lambda c: node[c].total / node[c].visits
                             + self.alpha * math.sqrt(log_visits / node[c].visits))
            history = self.step(depth, history, choice)
            path.append((node[choice], history[-1][2]))
            depth += 1
            nodes.append((depth, history))
            if untried:
                value = self.playout(depth, history)
                break
        else:
            value = auf_probability(self.model, history)
        for edge, outcome in path:
            edge.visits += 1
            edge.total += value
            if edge.outcomes is not None:
                edge.outcomes[outcome] = edge.outcomes.get(outcome, 0) + 1
        for node in nodes:
            visits, total = self.node_totals.get(node, (0, 0.0))
            self.node_totals[node] = (visits + 1, total + value)

    def value(self, depth: int, history: History) -> float:
        """MEP of a node from the tree: exact at terminals, playout mean at unexpanded nodes, else the max."""
        if depth == len(self.sequence):
            return auf_probability(self.model, history)
        node = self.edges.get((depth, history))
        if node is None:
            visits, total = self.node_totals[(depth, history)]
            return total / visits
        return max(self.choice_value(depth, history, c) for c, edge in node.items() if edge.visits)

    def choice_value(self, depth: int, history: History, choice) -> float:
        var = self.sequence[depth]
        if choice is not None:
            return self.value(depth + 1, history + ((var, "do", choice),))
        # the model's own P(v | history) (the one sampled from) weights the sampled outcomes: no frequency noise
        probs = self.distributions[(var, history)]
        seen = self.edges[(depth, history)][None].outcomes
        mass = sum(probs[v] for v in seen)
        return sum(probs[v] / mass * self.value(depth + 1, history + ((var, "see", v),)) for v in seen)


# --------------------------------------------------------------------------------------------- ACE
def average_causal_effect(model: CausalModel, name: str) -> float:
    """τ = P(Y∈S | do(V = last value)) − P(Y∈S | do(V = first value)); the usual ACE for binary domains."""
    var = model.index(name)
    last = len(model.variables[var].domain) - 1
    return round(auf_probability(model, ((var, "do", last),)) - auf_probability(model, ((var, "do", 0),)), 12) + 0.0


# --------------------------------------------------------------------------------------------- building models
def check_graph(names: list[str], parents: dict[str, list[str]]) -> None:
    """Unknown parents, cycles, and an order that is not topological are bad input (clear messages)."""
    require(len(set(names)) == len(names), "variable names must be unique")
    for name, pars in parents.items():
        for parent in pars:
            require(parent in names, f"unknown variable '{parent}' (parent of '{name}')",
                    f"known: {', '.join(names)}")
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for parent in parents.get(node, []):
            if state.get(parent) == 1:
                cycle = stack[stack.index(parent):] + [parent] if parent in stack else [node, parent]
                raise BadInputError(f"the causal graph is cyclic: {' <- '.join(cycle)}",
                                    "influence power needs a DAG")
            if state.get(parent) is None:
                visit(parent, stack + [parent])
        state[node] = 2

    for name in names:
        if name not in state:
            visit(name, [name])
    position = {n: i for i, n in enumerate(names)}
    for name, pars in parents.items():
        for parent in pars:
            require(position[parent] < position[name],
                    f"'{parent}' is listed after its child '{name}'; list variables in a topological order")


def build_model(spec: dict, cpts: dict[str, np.ndarray] | None = None) -> CausalModel:
    """A CausalModel from a parsed spec; `cpts` (fitted on data) override the spec's tables."""
    require(isinstance(spec, dict), "the model spec must be a mapping with 'variables', 'target', 'desired'")
    items = spec.get("variables")
    require(isinstance(items, list) and items, "the model spec needs a non-empty 'variables' list")
    require(all(isinstance(v, dict) and "name" in v for v in items), "every variable needs a 'name'")
    target = spec.get("target")
    names = [str(v["name"]) for v in items]
    require(target in names, f"target '{target}' is not a listed variable", f"known: {', '.join(names)}")
    require(names[-1] == target, f"the target '{target}' must be listed last")
    parents = {str(v["name"]): [str(p) for p in v.get("parents", [])] for v in items}
    check_graph(names, parents)
    variables = []
    for item in items:
        name = str(item["name"])
        domain = tuple(item.get("domain", [0, 1]))
        require(len(domain) >= 1 and len(set(map(str, domain))) == len(domain),
                f"'{name}': domain must be a non-empty list of distinct values")
        role = item.get("role", "observed" if name != target else "latent")
        require(role in ROLES, f"'{name}': role must be one of {', '.join(ROLES)}, got {role!r}")
        parent_idx = tuple(names.index(p) for p in parents[name])
        parent_sizes = [len(variables[p].domain) for p in parent_idx]
        cpt = cpts[name] if cpts and name in cpts else _parse_cpt(name, item.get("cpt"), domain, parents[name],
                                                                 [variables[p].domain for p in parent_idx])
        require(cpt.shape == (*parent_sizes, len(domain)), f"'{name}': CPT shape {cpt.shape} does not match "
                                                          f"parents x domain {(*parent_sizes, len(domain))}")
        actions = ()
        if role == "actionable":
            wanted = item.get("actions", list(domain))
            actions = tuple(_domain_index(name, domain, a) for a in wanted)
            require(bool(actions), f"'{name}': an actionable variable needs at least one action")
        variables.append(Variable(name, domain, parent_idx, cpt, role, actions))
    desired = spec.get("desired")
    require(isinstance(desired, list) and desired, "'desired' must be a non-empty list of target values")
    model = CausalModel(variables, frozenset(_domain_index(target, variables[-1].domain, d) for d in desired))
    return model


def _domain_index(name: str, domain: tuple, value) -> int:
    for i, item in enumerate(domain):
        if str(item) == str(value):
            return i
    raise BadInputError(f"value {value!r} is not in the domain {list(domain)} of '{name}'")


def _parse_cpt(name: str, raw, domain: tuple, parent_names: list[str], parent_domains: list[tuple]) -> np.ndarray:
    """`cpt` is a probability list (no parents) or a map "p1,p2,..." -> probability list over the domain."""
    require(raw is not None, f"'{name}' has no 'cpt' (give one, or pass --data to fit it)")
    shape = (*[len(d) for d in parent_domains], len(domain))
    table = np.full(shape, np.nan)
    if not parent_names:
        rows = {(): raw.get("", raw.get("()")) if isinstance(raw, dict) else raw}
    else:
        require(isinstance(raw, dict), f"'{name}': with parents the cpt must map 'v1,v2,...' to probabilities")
        rows = {}
        for key, probs in raw.items():
            parts = [p.strip() for p in str(key).split(",")]
            require(len(parts) == len(parent_names), f"'{name}': cpt key {key!r} needs one value per parent "
                                                     f"({', '.join(parent_names)})")
            rows[tuple(_domain_index(p, d, v) for p, d, v in zip(parent_names, parent_domains, parts))] = probs
    for index, probs in rows.items():
        require(isinstance(probs, list) and len(probs) == len(domain),
                f"'{name}': each cpt row needs {len(domain)} probabilities")
        row = np.asarray(probs, dtype=float)
        require(bool(np.all(np.isfinite(row))) and bool(np.all(row >= 0)) and abs(row.sum() - 1) < 1e-6,
                f"'{name}': cpt row {list(index)} must be finite, non-negative and sum to 1")
        table[index] = row
    require(not np.isnan(table).any(), f"'{name}': the cpt misses some parent configurations")
    return table


def load_spec(path: str) -> dict:
    import yaml

    file = Path(path)
    require(file.is_file(), f"model spec not found: {path}")
    text = file.read_text()
    try:
        return json.loads(text) if file.suffix.lower() == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise BadInputError(f"malformed model spec {path}: {type(exc).__name__}") from None


def fit_cpts(spec: dict, data_path: str, smoothing: float) -> tuple[dict[str, np.ndarray], int]:
    """Eq. (10) with the graph: P(V_i | PA_i) by (Laplace-smoothed) counting on observational rows.

    Latent variables must still be recorded in the data (learning may see more than the decision instance)."""
    file = Path(data_path)
    require(file.is_file(), f"data file not found: {data_path}")
    with open(file, newline="") as handle:
        rows = list(csv.DictReader(handle))
    require(bool(rows), f"{data_path} has no data rows")
    items = spec["variables"]
    columns = set(rows[0].keys())
    for item in items:
        require(str(item["name"]) in columns, f"variable '{item['name']}' has no column in {data_path}",
                f"columns: {', '.join(sorted(columns))}")
    domains = {str(v["name"]): [str(x) for x in v.get("domain", [0, 1])] for v in items}
    encoded: dict[str, np.ndarray] = {}
    for name, domain in domains.items():
        lookup = {value: i for i, value in enumerate(domain)}
        column = []
        for line, row in enumerate(rows, start=2):
            value = str(row[name]).strip()
            require(value in lookup, f"{data_path} line {line}: '{name}' = {value!r} is not in its domain {domain}")
            column.append(lookup[value])
        encoded[name] = np.asarray(column)
    cpts = {}
    for item in items:
        name = str(item["name"])
        parents = [str(p) for p in item.get("parents", [])]
        shape = (*[len(domains[p]) for p in parents], len(domains[name]))
        counts = np.full(shape, float(smoothing))
        np.add.at(counts, tuple(encoded[p] for p in parents) + (encoded[name],), 1.0)
        totals = counts.sum(axis=-1, keepdims=True)
        require(bool(np.all(totals > 0)), f"'{name}': a parent configuration never occurs in the data; "
                                          "use --set smoothing=1 (positivity is required, Prop. 1)")
        cpts[name] = counts / totals
    return cpts, len(rows)


def sample(model: CausalModel, n: int, seed: int) -> list[dict]:
    """Ancestral samples (observational data) from the model."""
    rng = np.random.default_rng(seed)
    columns: list[np.ndarray] = []
    for var in model.variables:
        probs = var.cpt[tuple(columns[p] for p in var.parents)] if var.parents else np.broadcast_to(
            var.cpt, (n, len(var.domain)))
        cumulative = np.cumsum(probs, axis=-1)
        draws = rng.random(n)[:, None]
        columns.append(np.minimum((draws > cumulative).sum(axis=-1), len(var.domain) - 1))
    return [{var.name: var.domain[columns[i][row]] for i, var in enumerate(model.variables)} for row in range(n)]


# --------------------------------------------------------------------------------------------- paper examples
def from_structural(variables: list[tuple[str, list[str], Role, Callable]], noise: dict[str, float],
                    target: str) -> CausalModel:
    """A binary SEM V := f(parents, N_V) with N_V ~ Bern(noise[V]) turned into CPTs by enumerating the noise."""
    items = []
    for name, parents, role, function in variables:
        cpt = {}
        for values in itertools.product((0, 1), repeat=len(parents)):
            probs = [0.0, 0.0]
            for n_value, p in ((1, noise[name]), (0, 1 - noise[name])):
                probs[function(*values, n_value)] += p
            cpt[",".join(map(str, values))] = probs
        items.append({"name": name, "parents": parents, "role": role, "cpt": cpt if parents else cpt[""]})
    return build_model({"variables": items, "target": target, "desired": [1]})


def paper_examples() -> list[dict]:
    """Examples 1-4 of Sec. 3.3 (S = {1}, all domains {0, 1}) with the paper's InP and ACE values."""
    ex1 = from_structural([("X", [], "actionable", lambda n: n),
                           ("Z", ["X"], "actionable", lambda x, n: x * n + (1 - x) * (1 - n)),
                           ("Y", ["Z"], "latent", lambda z, n: z * n + (1 - z) * (1 - n))],
                          {"X": 0.9, "Z": 0.9, "Y": 0.9}, "Y")
    ex2 = from_structural([("U", [], "latent", lambda n: n),
                           ("W", [], "actionable", lambda n: n),
                           ("X", ["U", "W"], "actionable", lambda u, w, n: u * w * (1 - n)),
                           ("Z", [], "actionable", lambda n: n),
                           ("Y", ["Z", "U"], "latent", lambda z, u, n: z * (1 - u) + (1 - z) * n)],
                          {"U": 0.5, "W": 0.1, "X": 0.1, "Z": 0.1, "Y": 0.4}, "Y")
    ex3 = from_structural([("X", [], "actionable", lambda n: n),
                           ("Z", ["X"], "actionable", lambda x, n: (1 - x) * n),
                           ("Y", ["X", "Z"], "latent", lambda x, z, n: x * z * n)],
                          {"X": 0.5, "Z": 0.5, "Y": 0.5}, "Y")
    ex4 = from_structural([("U", [], "latent", lambda n: n),
                           ("X", ["U"], "actionable", lambda u, n: u * n + (1 - u) * (1 - n)),
                           ("Z", ["X"], "actionable", lambda x, n: x * n + (1 - x) * (1 - n)),
                           ("Y", ["Z", "U"], "latent", lambda z, u, n: z * (1 - u) + (1 - z) * n)],
                          {"U": 0.5, "X": 0.9, "Z": 0.9, "Y": 0.4}, "Y")
    return [{"name": "example1", "model": ex1, "variable": "X", "expected": 0.0, "expected_ace": 0.64},
            {"name": "example2", "model": ex2, "variable": "W", "expected": 0.162, "expected_ace": 0.0},
            {"name": "example3", "model": ex3, "variable": "X", "expected": 0.25, "expected_ace": 0.0},
            {"name": "example4", "model": ex4, "variable": "X", "expected": -0.15, "expected_ace": 0.08}]


def resolve_model(config: InfluenceConfig) -> tuple[CausalModel, dict]:
    """The model named by `sem` (example:N or a spec file), with CPTs fitted on `data` when given."""
    if config.sem.startswith("example:"):
        names = {str(i + 1): e for i, e in enumerate(paper_examples())}
        key = config.sem.split(":", 1)[1]
        require(key in names, f"unknown example '{config.sem}'", "use example:1 .. example:4")
        require(config.data is None, "--data fits a spec file's graph; the paper examples carry their own CPTs")
        return names[key]["model"], {"source": config.sem}
    spec = load_spec(config.sem)
    if config.data is None:
        return build_model(spec), {"source": config.sem}
    require(isinstance(spec, dict) and isinstance(spec.get("variables"), list),
            "the model spec needs a 'variables' list")
    require(all(isinstance(v, dict) and "name" in v for v in spec["variables"]), "every variable needs a 'name'")
    names = [str(v["name"]) for v in spec["variables"]]
    check_graph(names, {str(v["name"]): [str(p) for p in v.get("parents", [])] for v in spec["variables"]})
    cpts, n_rows = fit_cpts(spec, config.data, config.smoothing)
    return build_model(spec, cpts), {"source": config.sem, "fitted_on": config.data, "rows": n_rows}


def measure(model: CausalModel, config: InfluenceConfig, seed: int) -> list[dict]:
    """InP (exact and/or UCT) and ACE for each requested actionable variable, ranked by InP."""
    names = config.variables or [v.name for v in model.variables if v.role == "actionable"]
    require(bool(names), "the model has no actionable variable")
    rows = []
    for name in names:
        row: dict = {"variable": name}
        if config.method in ("exact", "both"):
            row["exact"] = influence_exact(model, name, config.given)
        if config.method in ("mcts", "both"):
            row["mcts"] = influence_mcts(model, name, config.iterations, config.alpha, seed, config.given,
                                        config.backup)
        row["ace"] = average_causal_effect(model, name)
        rows.append(row)
    key = "exact" if config.method != "mcts" else "mcts"
    for rank, row in enumerate(sorted(rows, key=lambda r: -r[key]["inp"]), start=1):
        row["rank_inp"] = rank
    for rank, row in enumerate(sorted(rows, key=lambda r: -abs(r["ace"])), start=1):
        row["rank_ace"] = rank
    return rows


def plot(rows: list[dict], path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [r["variable"] for r in rows]
    series = {"InP (exact)": [r["exact"]["inp"] for r in rows] if "exact" in rows[0] else None,
              "InP (UCT)": [r["mcts"]["inp"] for r in rows] if "mcts" in rows[0] else None,
              "ACE": [r["ace"] for r in rows]}
    series = {k: v for k, v in series.items() if v is not None}
    width = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(max(4, 1.2 * len(labels) + 2), 3.4))
    for i, (label, values) in enumerate(series.items()):
        ax.bar(np.arange(len(labels)) + i * width, values, width, label=label)
    ax.axhline(0, color="black", linewidth=0.6)
    ax.set_xticks(np.arange(len(labels)) + width * (len(series) - 1) / 2, labels)
    ax.set(ylabel="value", title="influence power vs average causal effect")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(config: InfluenceConfig, ctx) -> dict:
    model, source = resolve_model(config)
    size = int(np.prod([len(v.domain) for v in model.variables]))
    require(size <= config.max_joint_size, f"the joint table has {size} cells (> max_joint_size "
                                           f"{config.max_joint_size})", "coarsen domains or raise max_joint_size")
    rows = measure(model, config, ctx.seed)
    for row in rows:
        key = "exact" if "exact" in row else "mcts"
        ctx.metrics[row["variable"]] = {"inp": round(row[key]["inp"], 6), "ace": round(row["ace"], 6),
                                        "decision": row[key]["decision"]}
        if "exact" in row and "mcts" in row:
            ctx.metrics[row["variable"]]["inp_mcts"] = round(row["mcts"]["inp"], 6)
    if ctx.out is None:  # --json without --out: metrics only
        return {"rows": rows}
    ctx.path("influence.json").write_text(json.dumps({"model": source, "given": config.given, "rows": rows},
                                                     indent=2))
    plot(rows, ctx.path("influence.png"))
    return {"rows": rows}
