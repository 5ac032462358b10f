"""Scores of a merged model on its parents' tasks (digits accuracies; next-token accuracy and perplexity for LMs)."""

from __future__ import annotations

from toolkit.merge.models import PlainModel


def evaluate(model: PlainModel, task_a: dict | None, task_b: dict | None) -> dict[str, float]:
    """Scores on the parents' tasks: digits accuracies (percent) on each parent's classes and on all ten; for
    language models whose parents name a held-out text (the LM merge zoo), next-token accuracy and perplexity."""
    from toolkit.merge.digits import FAMILIES, accuracy_on, net_from_state

    if model.hf_model is not None:
        from toolkit.merge.lmzoo import lm_task_scores

        return lm_task_scores(model, task_a, task_b)
    if model.family not in FAMILIES:
        return {}
    task_a, task_b = ((t or {}).get("classes") for t in (task_a, task_b))
    net = net_from_state(model.family, model.arch, model.state)
    scores = {"acc_union": accuracy_on(net)}
    if task_a is not None:
        scores["acc_task_a"] = accuracy_on(net, task_a)
    if task_b is not None:
        scores["acc_task_b"] = accuracy_on(net, task_b)
    return scores
