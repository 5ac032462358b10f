"""ROUGE-L is rouge-score called as MUSE calls it (use_stemmer=False, score(reference, prediction)); AUROC is
scikit-learn's, checked against the pairwise definition."""

from __future__ import annotations

import numpy as np
import pytest

from toolkit.eval.metrics import auroc, rouge_l

CASES = [
    ("the snake_case name is used", "snake case name used"),  # `_` splits words: snake, case
    ("my_var = other_var", "my var other var"),
    ("Привет мир, как дела", "Привет мир"),  # no [a-z0-9]: no tokens, 0 in MUSE
    ("Москва is the capital", "Москва capital"),
    ("café naïve résumé", "cafe naive resume"),  # accents cut words: caf / na ve / r sum
    ("Ĉu vi parolas Esperanton", "vi parolas"),
    ("In 1472, Scotland.", "1472"),
    ("", "anything"),
]


@pytest.mark.parametrize("prediction, reference", CASES)
def test_rouge_l_equals_rouge_score_as_muse_calls_it(prediction, reference):
    from rouge_score import rouge_scorer

    expect = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL", "rougeLsum"], use_stemmer=False).score(
        reference, prediction)["rougeL"]
    ours = rouge_l(prediction, reference)
    assert (ours["precision"], ours["recall"], ours["f1"]) == (expect.precision, expect.recall, expect.fmeasure)


def test_rouge_l_by_hand_on_the_tokenizer_cases():
    # snake_case is two tokens: prediction the snake case name is used (6), reference snake case name used (4)
    assert rouge_l("the snake_case name is used", "snake case name used")["recall"] == 1.0
    assert rouge_l("the snake_case name is used", "snake case name used")["precision"] == pytest.approx(4 / 6)
    assert rouge_l("Привет мир", "Привет мир")["f1"] == 0.0
    # "Москва is the capital" -> is the capital; "Москва capital" -> capital: LCS 1
    score = rouge_l("Москва is the capital", "Москва capital")
    assert (score["precision"], score["recall"]) == (pytest.approx(1 / 3), 1.0)
    assert rouge_l("café", "cafe")["f1"] == 0.0 and rouge_l("café", "caf")["f1"] == 1.0


def _pairwise(scores, positives):
    pos = [s for s, p in zip(scores, positives) if p]
    neg = [s for s, p in zip(scores, positives) if not p]
    return sum((a > b) + 0.5 * (a == b) for a in pos for b in neg) / (len(pos) * len(neg))


def test_auroc_is_the_pairwise_probability_with_ties():
    rng = np.random.default_rng(0)
    scores = rng.integers(0, 5, size=40).astype(float)  # many ties
    positives = rng.random(40) < 0.4
    assert auroc(scores, positives) == pytest.approx(_pairwise(scores.tolist(), positives.tolist()), abs=1e-12)
    assert auroc([0.1, 0.9], [0, 1]) == 1.0 and auroc([0.9, 0.1], [0, 1]) == 0.0


def test_auroc_needs_both_classes():
    from toolkit.core.errors import BadInputError

    with pytest.raises(BadInputError, match="one positive and one negative"):
        auroc([0.1, 0.2], [1, 1])
