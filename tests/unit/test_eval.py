import math

import numpy as np
import pytest
import torch

from toolkit.core.errors import BadInputError
from toolkit.eval.metrics import auroc, brier_score, exact_match, expected_calibration_error, token_f1
from toolkit.eval.perplexity import perplexity
from toolkit.linalg.hessian import HessianAccumulator, damped_cholesky
from toolkit.models.source import load_model


def _hand_perplexity(model, ids, max_length, stride):
    """Token by token: every token after the first is scored once, with the left context its window gives."""
    scored = {}
    begin = 0
    while begin < len(ids) - 1:
        end = min(begin + max_length, len(ids))
        with torch.no_grad():
            logprobs = torch.log_softmax(model(ids[begin:end][None]).logits[0].double(), -1)
        for position in range(begin + 1, end):
            scored.setdefault(position, -logprobs[position - begin - 1, ids[position]].item())
        if end == len(ids):
            break
        begin += stride
    return math.exp(sum(scored.values()) / len(scored)), len(scored)


@pytest.mark.parametrize("max_length,stride", [(16, 16), (16, 8), (16, 5), (64, 64)])
def test_perplexity_matches_hand_computation(tiny_gpt2_dir, max_length, stride):
    model, _ = load_model(str(tiny_gpt2_dir))
    ids = torch.randint(0, 200, (50,), generator=torch.Generator().manual_seed(0))
    result = perplexity(model, ids, max_length=max_length, stride=stride)
    expected, count = _hand_perplexity(model, ids, max_length, stride)
    assert result["tokens"] == count
    assert result["ppl"] == pytest.approx(expected, rel=1e-5)


def test_perplexity_bad_input(tiny_gpt2_dir):
    model, _ = load_model(str(tiny_gpt2_dir))
    with pytest.raises(BadInputError):
        perplexity(model, torch.tensor([3]))
    with pytest.raises(BadInputError):
        perplexity(model, torch.arange(10), max_length=4, stride=8)


def test_qa_metrics():
    assert exact_match("The Eiffel Tower!", ["eiffel tower"]) == 1.0
    assert token_f1("big red dog", ["red dog"]) == pytest.approx(0.8)
    assert token_f1("cat", ["dog"]) == 0.0


def test_calibration_metrics_against_hand_values():
    probs = np.array([[0.9, 0.1], [0.6, 0.4], [0.3, 0.7], [0.8, 0.2]])
    labels = np.array([0, 1, 1, 0])
    # bins: 0.9 (correct), 0.6 (wrong), 0.7 (correct), 0.8 (correct) each alone in its bin
    assert expected_calibration_error(probs, labels) == pytest.approx((0.1 + 0.6 + 0.3 + 0.2) / 4)
    assert brier_score(probs, labels) == pytest.approx(np.mean([0.02, 0.72, 0.18, 0.08]))
    assert auroc([0.9, 0.8, 0.3, 0.3], [1, 0, 1, 0]) == pytest.approx(0.625)
    with pytest.raises(BadInputError):
        auroc([0.1, 0.2], [1, 1])


def test_hessian_accumulator_is_exact_over_batches():
    x = torch.randn(3, 7, 5, dtype=torch.float64)
    acc = HessianAccumulator(5)
    for batch in x:
        acc.add(batch)
    flat = x.reshape(-1, 5)
    torch.testing.assert_close(acc.H, 2 * flat.t() @ flat / flat.shape[0])


def test_damped_cholesky_escalates_and_rejects_nan():
    singular = torch.ones(4, 4, dtype=torch.float64)
    L, damp = damped_cholesky(singular, percdamp=0.0)
    assert damp > 0 and torch.isfinite(L).all()
    with pytest.raises(Exception, match="NaN"):
        damped_cholesky(torch.full((3, 3), float("nan"), dtype=torch.float64))
