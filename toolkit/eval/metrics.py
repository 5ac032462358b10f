"""Shared metrics: exact match / token F1 (SQuAD normalisation), accuracy, ECE, Brier, AUROC."""

from __future__ import annotations

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
    """Probability that a random positive scores above a random negative (ties count one half)."""
    scores, positives = np.asarray(scores, dtype=float), np.asarray(positives).astype(bool)
    pos, neg = scores[positives], scores[~positives]
    if len(pos) == 0 or len(neg) == 0:
        raise BadInputError("AUROC needs at least one positive and one negative example")
    greater = (pos[:, None] > neg[None, :]).sum()
    ties = (pos[:, None] == neg[None, :]).sum()
    return float((greater + 0.5 * ties) / (len(pos) * len(neg)))
