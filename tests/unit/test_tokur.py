"""TokUR math: decomposition vs hand computation, σ = 0 gives zero epistemic, the hook equals a dense perturbed
forward pass, σ calibration, answer extraction and selection."""

import copy
import math

import numpy as np
import pytest
import torch

from toolkit.uq import tokur
from toolkit.uq.run import selection_rows


def h(*p):
    return -sum(x * math.log(x) for x in p if x > 0)


def test_decomposition_matches_hand_computation():
    probs = torch.tensor([[[0.5, 0.5]], [[0.9, 0.1]]])  # M = 2, T = 1, V = 2
    parts = tokur.decompose(probs.log())
    assert float(parts["total"][0]) == pytest.approx(h(0.7, 0.3))
    assert float(parts["aleatoric"][0]) == pytest.approx((h(0.5, 0.5) + h(0.9, 0.1)) / 2)
    assert float(parts["epistemic"][0]) == pytest.approx(h(0.7, 0.3) - (h(0.5, 0.5) + h(0.9, 0.1)) / 2)


def test_decomposition_non_negative_and_sums():
    torch.manual_seed(0)
    parts = tokur.decompose(torch.randn(6, 20, 50).mul(3).log_softmax(-1))
    assert (parts["epistemic"] >= 0).all() and (parts["aleatoric"] >= 0).all()
    assert torch.allclose(parts["total"], parts["aleatoric"] + parts["epistemic"], atol=1e-12)
    identical = tokur.decompose(torch.randn(1, 5, 9).log_softmax(-1).expand(1, 5, 9))
    assert torch.equal(identical["epistemic"], torch.zeros(5, dtype=torch.float64))


@pytest.fixture(scope="module")
def gpt2(tiny_gpt2_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_gpt2_dir).eval()


@pytest.fixture(scope="module")
def llama(tiny_llama_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_llama_dir).eval()


PROMPT, RESPONSE = torch.tensor([5, 17, 42, 8]), torch.tensor([9, 33, 2, 71, 12])


def test_sigma_zero_gives_exactly_zero_epistemic(gpt2):
    projections = tokur.attention_projections(gpt2, rank=4)
    parts = tokur.token_uncertainty(gpt2, projections, PROMPT, RESPONSE, sigma=0.0, samples=5, seed=0)
    assert torch.equal(parts["epistemic"], torch.zeros(len(RESPONSE), dtype=torch.float64))
    assert torch.equal(parts["total"], parts["aleatoric"])


@pytest.mark.parametrize("which", ["gpt2", "llama"])
def test_hook_equals_dense_perturbed_weights(which, request):
    model = request.getfixturevalue(which)
    projections = tokur.attention_projections(model, rank=3)
    noises = tokur.draw_noise(projections, 0.05, torch.Generator().manual_seed(1))
    with tokur.perturbed(projections, noises):
        hooked = tokur.response_log_probs(model, PROMPT, RESPONSE)
    dense = copy.deepcopy(model)
    dense_projections = tokur.attention_projections(dense, rank=3)
    for p, noise in zip(dense_projections, noises):  # (out, in) weights: Conv1D stores them transposed
        conv1d = type(p.module).__name__ == "Conv1D"
        weight = p.module.weight.data.t() if conv1d else p.module.weight.data
        weight.copy_(weight + p.basis @ noise)
    assert torch.allclose(hooked, tokur.response_log_probs(dense, PROMPT, RESPONSE), atol=1e-5)
    assert not torch.allclose(hooked, tokur.response_log_probs(model, PROMPT, RESPONSE), atol=1e-5)


def test_basis_is_orthonormal_top_singular_space(llama):
    p = tokur.attention_projections(llama, rank=4)[0]
    assert torch.allclose(p.basis.T @ p.basis, torch.eye(4), atol=1e-5)


def test_epistemic_grows_with_sigma(gpt2):
    projections = tokur.attention_projections(gpt2, rank=4)
    means = [float(tokur.token_uncertainty(gpt2, projections, PROMPT, RESPONSE, s, 6, seed=0)["epistemic"].mean())
             for s in (0.02, 0.2, 2.0)]
    assert 0 < means[0] < means[1] < means[2]


def test_sigma_calibration_respects_threshold(gpt2):
    projections = tokur.attention_projections(gpt2, rank=4)
    anchors = [(torch.arange(3, 20), torch.arange(20, 40)), (torch.arange(50, 60), torch.arange(60, 90))]
    sigma, trace = tokur.calibrate_sigma(gpt2, projections, anchors, threshold=0.01, iterations=8, sigma_max=200.0)
    assert 0 < sigma < 200 and len(trace) == 8
    # binary-search invariant: every probed σ above the answer broke the threshold, the answer itself kept it
    assert all(t["relative_nll_change"] > 0.01 for t in trace if t["sigma"] > sigma)
    assert all(t["relative_nll_change"] <= 0.01 for t in trace if t["sigma"] == sigma)


def test_anchor_nll_counts_answer_tokens_only(gpt2):
    prompt, answer = torch.tensor([5, 17, 42, 8]), torch.tensor([9, 33, 2])
    with torch.no_grad():
        logits = gpt2(torch.cat([prompt, answer]).unsqueeze(0)).logits[0].log_softmax(-1)
    by_hand = -sum(float(logits[len(prompt) - 1 + i, t]) for i, t in enumerate(answer.tolist())) / len(answer)
    assert tokur.mean_response_nll(gpt2, [(prompt, answer)]) == pytest.approx(by_hand, rel=1e-5)


def test_extract_answer_gsm8k_format():
    assert tokur.extract_answer("She pays 3*2 = <<3*2=6>>6 dollars.\n#### 1,200") == "1200"
    assert tokur.extract_answer("so the answer is 46.") == "46"
    assert tokur.extract_answer("x = 2.50") == "2.5" and tokur.extract_answer("-7.0") == "-7"
    assert tokur.extract_answer("no digits") is None


def test_aggregation_and_best_of_n():
    values = torch.tensor([0.1, 0.4, 0.1])
    assert tokur.aggregate(values, "mean") == pytest.approx(0.2)
    assert tokur.aggregate(values, "sum") == pytest.approx(0.6)
    assert tokur.aggregate(values, "max") == pytest.approx(0.4)
    assert tokur.best_of_n([0.3, 0.1, 0.1]) == 1


def test_selection_rows_by_hand():
    correct = np.array([[True, False], [False, True], [False, False]])
    scores = np.array([[0.1, 0.5], [0.9, 0.2], [0.3, 0.3]])
    rows = {r["selection"]: r["accuracy"] for r in selection_rows(correct, scores)}
    assert rows["tokur"] == pytest.approx(2 / 3) and rows["random"] == pytest.approx(1 / 3)
    assert rows["first"] == pytest.approx(1 / 3) and rows["oracle"] == pytest.approx(2 / 3)


def test_load_problems_reads_gsm8k_math_and_metamath(tmp_path):
    import json

    from toolkit.uq.run import load_problems

    path = tmp_path / "mixed.jsonl"
    rows = [{"question": "q1", "answer": "3 + 4 = 7\n#### 7"},
            {"problem": "q2", "solution": "Hence $\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}$."},
            {"problem": "q3", "solution": "Long work ... \\boxed{p-q}", "answer": "p - q"},
            {"query": "q4", "response": "Work.\nThe answer is: \\frac{1}{2}"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    items = load_problems(str(path))
    assert [i["question"] for i in items] == ["q1", "q2", "q3", "q4"]
    assert [i["final"] for i in items] == ["7", "\\left( 3, \\frac{\\pi}{2} \\right)", "p - q", "\\frac{1}{2}"]
    assert items[2]["answer"].startswith("Long work")  # the worked solution feeds the σ anchors


def test_majority_vote_groups_equivalent_answers():
    from toolkit.uq.run import majority_vote_accuracy

    correct = np.array([[False, True, True, False], [True, False, False, False], [False, False, False, False]])
    finals = [["3", "0.5", "\\frac{1}{2}", "3"],  # 3 ×2 vs 1/2 ×2 (equivalent forms): tie -> "3" seen first: wrong
              ["7", "8", "8", None],  # "8" wins: wrong
              [None, None, None, None]]  # no answer: wrong
    assert majority_vote_accuracy(correct, finals) == 0.0
    finals[0] = ["0.5", "\\frac{1}{2}", "1/2", "3"]
    correct[0] = [True, True, True, False]
    assert majority_vote_accuracy(correct, finals) == pytest.approx(1 / 3)


@pytest.mark.parametrize("which", ["llama", "gpt2"])
def test_response_log_probs_equal_the_full_forward(which, request):
    """The LM head on the response positions only (logits_to_keep, where the forward takes it) gives the numbers of
    the full forward's slice; repeated rows give the same numbers per row."""
    from toolkit.models.adapters import takes_logits_to_keep

    model = request.getfixturevalue(which)
    ids = torch.cat([PROMPT, RESPONSE]).unsqueeze(0)
    with torch.no_grad():
        full = model(ids).logits[0, len(PROMPT) - 1:-1].float().log_softmax(-1)
    assert torch.allclose(tokur.response_log_probs(model, PROMPT, RESPONSE), full, atol=1e-5)
    rows = tokur.response_log_probs(model, PROMPT, RESPONSE, rows=3)
    assert rows.shape == (3, *full.shape) and torch.allclose(rows, full.expand(3, -1, -1), atol=1e-5)
    if which == "llama":  # transformers' Llama takes it: the head-on-the-response path is the one checked above
        assert takes_logits_to_keep(model)
    assert takes_logits_to_keep(torch.nn.Linear(2, 2)) is False
