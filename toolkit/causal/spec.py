"""Building causal models: graph checks, YAML/JSON specs with CPTs, CPTs fitted on CSV data (Eq. 10),
sampling, and the paper's worked examples.
"""

from __future__ import annotations

import csv
import itertools
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np

from toolkit.causal.model import ROLES, CausalModel, Role, Variable
from toolkit.core.errors import BadInputError, require


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
