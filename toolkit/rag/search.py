"""Binary-tree search for DeepRAG's training data (paper §3.2; official `sragsamplev2.py`, read, not copied).

Every sub-question has two children: answer it parametrically (retrieval count unchanged) or retrieve and answer
from the passages (count + 1; pruned when the reader says the context has no related information). Nodes come off
a priority queue ordered by retrieval count (ties: first pushed first, so parametric before retrieval), so the
first correct terminal path popped uses the fewest retrievals of any correct path in the tree. (The official code
pushes both children with priority parent count + 1, so a path whose last step retrieved ties with one that has one
retrieval fewer; we order by the count itself, as the paper states.)

Optional evidence check (`agrees`, not in the paper): the search judges a path only by its final answer, so a wrong
parametric answer to a hop the model does not know survives whenever the rest of the path still lands on the gold
answer (a wrong city that lies in the right country). Imitating such a path teaches the model to skip retrieval on
a fact it does not know. With `agrees`, a parametric child whose answer contradicts what the model reads from the
retrieved passages is pruned (a reader answer of "[No related Info]" cannot contradict), so every parametric step
on the returned path is one the evidence confirms.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

from toolkit.rag.prompts import NO_INFO
from toolkit.rag.trace import FOLLOW, INTERMEDIATE, SEARCH, Step, Trace, render_step

__all__ = ["NO_INFO", "Oracle", "SearchResult", "calibration_pairs", "tree_search"]


class Oracle(Protocol):
    """What the search asks the model (or a script) at a node."""

    def propose(self, question: str, steps: Sequence[Step]) -> tuple[str, str]:
        """("follow", sub-question) or ("final", answer)."""

    def parametric(self, question: str, steps: Sequence[Step], subquery: str) -> str: ...

    def from_context(self, question: str, steps: Sequence[Step], subquery: str, passages: list[str]) -> str: ...


@dataclass
class SearchResult:
    trace: Trace | None
    expansions: int
    explored: list[tuple[int, str]] = field(default_factory=list)  # (retrievals, final answer) of terminal paths
    popped: list[int] = field(default_factory=list)  # retrieval count of every node in the order it was expanded


def tree_search(question: str, oracle: Oracle, retrieve: Callable[[str], list[str]],
                is_correct: Callable[[str], bool], max_depth: int = 6, max_expansions: int = 64,
                agrees: Callable[[str, str], bool] | None = None, children: str = "tree") -> SearchResult:
    """The paper's search with `children="tree"`: both children at every node, popped fewest retrievals first.
    `children="always"` keeps only the retrieval child, `"never"` only the parametric one: one path each, the
    training data of the always-retrieve and no-retrieval baselines."""
    if children not in ("tree", "always", "never"):
        raise ValueError(f"children must be tree, always or never, not {children!r}")
    order = itertools.count()
    heap: list[tuple[int, int, list[Step]]] = [(0, next(order), [])]
    result = SearchResult(trace=None, expansions=0)
    while heap and result.expansions < max_expansions:
        retrievals, _, steps = heapq.heappop(heap)
        result.expansions += 1
        result.popped.append(retrievals)
        kind, text = oracle.propose(question, steps)
        if kind == "final" or len(steps) >= max_depth:
            answer = text if kind == "final" else (steps[-1].answer if steps else "")
            result.explored.append((retrievals, answer))
            if is_correct(answer):
                result.trace = Trace(question=question, steps=list(steps), final=answer)
                return result
            continue
        parametric = oracle.parametric(question, steps, text) if children != "always" else None
        passages = retrieve(text) if children != "never" else []
        grounded = oracle.from_context(question, steps, text, passages) if passages else NO_INFO
        has_info = NO_INFO.lower() not in grounded.lower()
        if parametric is not None and (agrees is None or not has_info or agrees(parametric, grounded)):
            heapq.heappush(heap, (retrievals, next(order),
                                  steps + [Step(text, parametric, None, alternative=grounded)]))
        if has_info:
            heapq.heappush(heap, (retrievals + 1, next(order),
                                  steps + [Step(text, grounded, passages, alternative=parametric)]))
    return result


def calibration_pairs(prompt: str, trace: Trace, format: str = "decision") -> list[dict]:
    """Stage-II preference pairs (chain of calibration): at each step of the minimum-retrieval path, the atomic
    decision the path took is chosen and the opposite decision at the same step is rejected. The prompt holds the
    path so far and ends with the step's own "Follow up: <sub-question>" line (the official make_pair writes the
    original question there, which trains the wrong conditional).

    format="decision" (the paper's, official make_pair.py): the two sides are the decisions alone, the search line
    against a bare "Intermediate answer:". format="answer" (ours): the parametric side carries its answer (the one
    the path gave, or the one the search's parametric child gave when the path retrieved)."""
    if format not in ("decision", "answer"):
        raise ValueError(f"format must be decision or answer, not {format!r}")
    pairs, prefix = [], prompt
    for step in trace.steps:
        head = prefix + f"{FOLLOW} {step.subquery}\n"
        if format == "decision":
            answer_line = INTERMEDIATE
        else:
            answer_line = f"{INTERMEDIATE} {step.answer if not step.retrieves else step.alternative or ''}".rstrip()
        if step.retrieves:
            chosen, rejected = SEARCH, answer_line
        else:
            chosen, rejected = answer_line, SEARCH
        pairs.append({"prompt": head, "chosen": chosen, "rejected": rejected, "retrieve": step.retrieves,
                      "subquery": step.subquery, "format": format})
        prefix += render_step(step)
    return pairs
