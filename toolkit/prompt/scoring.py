"""Class-word scoring for MHLP's posterior predictive: p(class | question, θ) from the task model's log-probability
of each class's answer line (`LLM.score_choices`, which a local model computes on a cached prefix), and the
Bayesian model average over the posterior samples."""

from __future__ import annotations

from typing import Sequence

import numpy as np


def normalise(log_probs: np.ndarray) -> np.ndarray:
    """Softmax over the last axis: class probabilities from (unnormalised) class log-probabilities."""
    shifted = np.asarray(log_probs, float) - np.max(log_probs, axis=-1, keepdims=True)
    weights = np.exp(shifted)
    return weights / weights.sum(axis=-1, keepdims=True)


def model_average(per_sample_probs: Sequence[np.ndarray]) -> np.ndarray:
    """Bayesian model average: the posterior predictive p(y|x) ≈ (1/S) Σ_s p(y|x, θ_s) over the S posterior
    samples (repeated samples count once per occurrence, as MCMC draws do)."""
    return np.mean(np.stack(per_sample_probs), axis=0)


def class_probabilities(llm, system_prompt: str, questions: Sequence[str], classes: Sequence[str],
                        answer_template: str = "Answer: {}", chat: bool = False) -> np.ndarray:
    """(len(questions), len(classes)) p(class | question, θ): the task model's log-probability of the answer line
    `answer_template` filled with each class, after the task prompt, normalised over the classes."""
    from toolkit.prompt.mhlp import task_prompt

    prompts = [task_prompt(system_prompt, q) for q in questions]
    return normalise(np.array(llm.score_choices(prompts, [answer_template.format(c) for c in classes], chat)))
