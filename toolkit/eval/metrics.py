"""Shared metrics: exact match / token F1 (SQuAD normalisation), accuracy, ECE, Brier, AUROC (scikit-learn),
ROUGE-L (rouge-score, as MUSE calls it)."""

from __future__ import annotations

import functools
import re
import string
from collections import Counter
from typing import Sequence

import numpy as np

from toolkit.core.errors import BadInputError


def normalize_answer(text: str) -> str:
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def exact_match(prediction: str, answers: Sequence[str]) -> float:
    return float(any(normalize_answer(prediction) == normalize_answer(a) for a in answers))


def token_f1(prediction: str, answers: Sequence[str]) -> float:
    def f1(pred: str, gold: str) -> float:
        p, g = normalize_answer(pred).split(), normalize_answer(gold).split()
        common = sum((Counter(p) & Counter(g)).values())
        if common == 0:
            return 0.0
        precision, recall = common / len(p), common / len(g)
        return 2 * precision * recall / (precision + recall)

    return max((f1(prediction, a) for a in answers), default=0.0)


def accuracy(predictions: Sequence, labels: Sequence) -> float:
    if len(predictions) != len(labels) or not labels:
        raise BadInputError("accuracy needs equal, non-empty prediction and label lists")
    return float(np.mean([p == y for p, y in zip(predictions, labels)]))


def _probs_labels(probs, labels) -> tuple[np.ndarray, np.ndarray]:
    probs, labels = np.asarray(probs, dtype=float), np.asarray(labels)
    if probs.ndim != 2 or probs.shape[0] != labels.shape[0] or probs.shape[0] == 0:
        raise BadInputError("expected probabilities of shape (n, classes) and n labels")
    return probs, labels.astype(int)


def expected_calibration_error(probs, labels, bins: int = 10) -> float:
    """ECE with equal-width confidence bins over the top-class probability."""
    probs, labels = _probs_labels(probs, labels)
    confidence = probs.max(axis=1)
    correct = (probs.argmax(axis=1) == labels).astype(float)
    edges = np.linspace(0.0, 1.0, bins + 1)
    ece = 0.0
    for low, high in zip(edges[:-1], edges[1:]):
        in_bin = (confidence > low) & (confidence <= high) if low > 0 else (confidence >= low) & (confidence <= high)
        if in_bin.any():
            ece += in_bin.mean() * abs(correct[in_bin].mean() - confidence[in_bin].mean())
    return float(ece)


def brier_score(probs, labels) -> float:
    """Mean over examples of the squared distance between the probability vector and the one-hot label."""
    probs, labels = _probs_labels(probs, labels)
    onehot = np.eye(probs.shape[1])[labels]
    return float(((probs - onehot) ** 2).sum(axis=1).mean())


def auroc(scores, positives) -> float:
    """Area under the ROC curve (scikit-learn's roc_auc_score): the probability that a random positive scores above
    a random negative, ties counting one half."""
    from sklearn.metrics import roc_auc_score

    scores, positives = np.asarray(scores, dtype=float), np.asarray(positives).astype(bool)
    if positives.all() or not positives.any():
        raise BadInputError("AUROC needs at least one positive and one negative example")
    return float(roc_auc_score(positives, scores))


def rouge_l(prediction: str, reference: str) -> dict[str, float]:
    """ROUGE-L precision, recall and F1 of `prediction` against `reference` with the `rouge-score` package, called
    as MUSE does (RougeScorer, use_stemmer=False, score(reference, prediction)). Its default tokenizer lower-cases
    and keeps only [a-z0-9] runs: `snake_case` is two words, `café` becomes `caf`, and text without ASCII letters or
    digits (Cyrillic, Greek, CJK) has no tokens and scores 0, in MUSE as here."""
    score = _rouge_scorer().score(reference, prediction)["rougeL"]
    return {"precision": float(score.precision), "recall": float(score.recall), "f1": float(score.fmeasure)}


@functools.cache
def _rouge_scorer():
    try:
        from rouge_score import rouge_scorer
    except ImportError:
        from toolkit.core.errors import ResourceError

        raise ResourceError("ROUGE-L needs the 'rouge-score' package", "pip install rouge-score") from None
    return rouge_scorer.RougeScorer(["rougeL"], use_stemmer=False)
