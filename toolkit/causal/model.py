"""The discrete causal Bayesian network of `causal influence` and its AUF probability, Eq. (12).

Variables in topological (= decision) order V_1..V_d, Y; each `actionable`, `observed` or `latent`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from toolkit.core.errors import BadInputError, require

Role = Literal["actionable", "observed", "latent"]
ROLES = ("actionable", "observed", "latent")



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
