"""MHLP class-word scoring: the Bayesian model average and its rows against hand computations (the cached-prefix
`score_choices` itself is tested in test_llm.py)."""

import math
from types import SimpleNamespace

import numpy as np
import pytest

from toolkit.llm.base import LLM, ScoredText
from toolkit.prompt import scoring
from toolkit.prompt.run import MHLPConfig, score_rows


def test_normalise_is_a_stable_softmax():
    assert scoring.normalise(np.array([[0.0, math.log(3)]])) == pytest.approx(np.array([[0.25, 0.75]]))
    assert scoring.normalise(np.array([-1000.0, -1000.0 + math.log(3)])) == pytest.approx([0.25, 0.75])


def test_model_average_counts_repeated_samples():
    a, b = np.array([[0.2, 0.8], [0.6, 0.4]]), np.array([[0.5, 0.5], [0.0, 1.0]])
    # samples θ_a, θ_a, θ_b: (2a + b) / 3 computed by hand
    expected = np.array([[(0.4 + 0.5) / 3, (1.6 + 0.5) / 3], [1.2 / 3, (0.8 + 1.0) / 3]])
    assert scoring.model_average([a, a, b]) == pytest.approx(expected)


class FixedScorer(LLM):
    """Scores through `LLM.score` only (the base class's `score_choices`): prompt "A" gives p(yes) = 0.8, any other prompt p(yes) = 0.4."""

    capabilities = frozenset({"score"})

    def score(self, prompts, continuations, chat=False):
        out = []
        for prompt, continuation in zip(prompts, continuations):
            p_yes = 0.8 if prompt.startswith("A\n") else 0.4
            out.append(ScoredText(math.log(p_yes if continuation.endswith("yes") else 1 - p_yes), [], []))
        return out


def test_score_rows_average_the_samples_probabilities():
    config = MHLPConfig(task_model="t", proposer_model="t", data="d", initial_prompt="B", predictive="score")
    ctx = SimpleNamespace(progress=lambda items, total, description: items)
    train = [{"question": "t1", "answer": "yes"}, {"question": "t2", "answer": "no"}]
    test = [{"question": "q1", "answer": "yes"}, {"question": "q2", "answer": "no"}]
    rows, selection = score_rows(config, ctx, FixedScorer(), ["A", "B"], ["A", "A", "B"], train, test,
                                 ["no", "yes"])
    rows = {row["method"]: row for row in rows}
    # ensemble p(yes) = (0.8 + 0.8 + 0.4) / 3 = 2/3 on both questions: accuracy 1/2, ECE |2/3 - 1/2|,
    # Brier mean(2 (1/3)^2, 2 (2/3)^2) = 5/9
    assert rows["mhlp"]["accuracy"] == pytest.approx(0.5)
    assert rows["mhlp"]["ece"] == pytest.approx(1 / 6)
    assert rows["mhlp"]["brier"] == pytest.approx(5 / 9)
    # A and B tie on the chain examples (1 of 2 each); the mean gold log-prob breaks the tie:
    # A (log 0.8 + log 0.2) / 2 = -0.916 < B (log 0.4 + log 0.6) / 2 = -0.714, so B is `single`
    assert [s["train_accuracy"] for s in selection] == [0.5, 0.5]
    assert [s["train_gold_logprob"] for s in selection] == pytest.approx(
        [(math.log(0.8) + math.log(0.2)) / 2, (math.log(0.4) + math.log(0.6)) / 2])
    # B: p(yes) = 0.4, predicts "no" with confidence 0.6, right on q2 only; Brier mean(2 0.6^2, 2 0.4^2) = 0.52
    for method in ("single", "initial"):
        assert rows[method]["accuracy"] == pytest.approx(0.5) and rows[method]["ece"] == pytest.approx(0.1)
        assert rows[method]["brier"] == pytest.approx(0.52) and rows[method]["confidence"] == pytest.approx(0.6)
    assert selection[0]["eval"]["confidence"] == pytest.approx(0.8) and rows["mhlp"]["confidence"] == pytest.approx(2 / 3)
