"""The paper's UCT estimator of influence power (α = √2), Eq. (9).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from toolkit.causal.exact import check_measurable, given_history, summarise
from toolkit.causal.model import CausalModel, History, auf_probability, choices, conditional, decision_sequence
from toolkit.core.errors import require


# --------------------------------------------------------------------------------------------- UCT
def influence_mcts(model: CausalModel, name: str, iterations: int, alpha: float = math.sqrt(2), seed: int = 0,
                   given: dict | None = None, backup: str = "max") -> dict:
    """The paper's estimator (Sec. 4.1): UCT over alter/observe choices with Eq. (8) selection, expansion of one
    untried choice, a random playout and the exact AUF probability (Eq. 12) at the terminal.

    The root's per-choice values are read from the tree either as the plain averages of Eq. (9)
    (`backup="mean"`), which include every exploratory branch and so sit below the MEP of suboptimal root
    choices for a long time with α = √2, or by the Bellman backup over the same tree (`backup="max"`): max over
    tried choices at decision nodes, observed outcomes weighted by P(v | history), exact values at terminals."""
    var = check_measurable(model, name)
    require(iterations >= len(choices(model, var)), f"UCT needs at least {len(choices(model, var))} iterations "
                                                    f"to try every root choice of '{name}'")
    search = _Search(model, [var, *decision_sequence(model, var)], alpha, random.Random(seed))
    root: History = given_history(model, var, given or {})
    for _ in range(iterations):
        search.iterate(root)
    edges = search.edges[(0, root)]
    values = {c: (search.choice_value(0, root, c) if backup == "max" else edge.total / edge.visits)
              for c, edge in edges.items() if edge.visits}
    result = summarise(model, var, values)
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
