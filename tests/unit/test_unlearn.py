"""PRISM / NPO / RMU math against independent references, and guards for the official code's bugs."""

import itertools
import math

import pytest
import torch

from toolkit.unlearn.data import batch_indices, collate
from toolkit.unlearn.losses import (
    decouple,
    fgsm_probe_loss,
    mean_nll,
    npo_loss,
    probe_weight,
    project_out,
    rmu_loss,
    sam_perturbation,
    sequence_logprob,
)
from toolkit.unlearn.metrics import lcs_length, mia_auc, min_k_score, privleak, rouge_l

pytestmark = pytest.mark.usefixtures("one_thread")


# ---- gradient decoupling and SAM -------------------------------------------------------------------------------

def test_projection_is_orthogonal_and_equals_least_squares_residual():
    torch.manual_seed(0)
    g_f, g_r = torch.randn(7, 5, dtype=torch.float64), torch.randn(7, 5, dtype=torch.float64)
    projected = project_out(g_f, g_r, eps=0.0)
    assert abs(float((projected * g_r).sum())) < 1e-10
    coef = torch.linalg.lstsq(g_r.reshape(-1, 1), g_f.reshape(-1, 1)).solution  # independent: 1-D least squares
    assert torch.allclose(projected, g_f - coef.item() * g_r, atol=1e-10)


def test_decouple_is_per_tensor_and_unconditional():
    torch.manual_seed(1)
    g_r = [torch.randn(4, 3), torch.randn(6), None]
    g_f = [-2.0 * g_r[0] + 0.1 * torch.randn(4, 3), torch.randn(6), torch.randn(2)]
    out = decouple(g_f, g_r)
    for a, b in zip(out[:2], g_r[:2]):
        assert abs(float((a * b).sum())) < 1e-4 * float(a.norm() * b.norm()) + 1e-6
    # unconditional: the conflicting tensor (negative dot) and the other one are both projected
    assert not torch.allclose(out[1], g_f[1])
    assert out[2] is g_f[2]
    # per tensor, not on the concatenation: the global dot product is not what is removed
    flat = project_out(torch.cat([g_f[0].flatten(), g_f[1]]), torch.cat([g_r[0].flatten(), g_r[1]]))
    assert not torch.allclose(flat, torch.cat([out[0].flatten(), out[1]]))


def test_sam_perturbation_norm_is_rho_and_parallel_to_gradient():
    torch.manual_seed(2)
    grads = [torch.randn(3, 3), None, torch.randn(5)]
    eps = sam_perturbation(grads, rho=0.011)
    norm = math.sqrt(sum(float((e ** 2).sum()) for e in eps if e is not None))
    assert norm == pytest.approx(0.011, rel=1e-5)
    assert eps[1] is None
    assert torch.allclose(eps[0] / 0.011 * math.sqrt(sum(float((g ** 2).sum()) for g in grads if g is not None)),
                          grads[0], atol=1e-5)


def test_sam_gradient_on_a_quadratic_matches_hand_computation():
    """L(θ) = ½ θᵀAθ: g = Aθ, ε = ρ g/‖g‖, SAM gradient = A(θ + ε), here with numbers worked out by hand."""
    A = torch.tensor([[2.0, 0.0], [0.0, 4.0]])
    theta = torch.tensor([3.0, 1.0], requires_grad=True)
    (g,) = torch.autograd.grad(0.5 * theta @ A @ theta, theta)  # (6, 4), norm sqrt(52)
    (eps,) = sam_perturbation([g], rho=0.5)
    shifted = (theta + eps).detach().requires_grad_(True)
    (g_sam,) = torch.autograd.grad(0.5 * shifted @ A @ shifted, shifted)
    r = 0.5 / math.sqrt(52)
    assert torch.allclose(g_sam, torch.tensor([2 * (3 + 6 * r), 4 * (1 + 4 * r)]), atol=1e-6)


# ---- NPO, probe schedule, probe loss ---------------------------------------------------------------------------

def test_probe_weight_is_positive_after_epoch_zero_and_anneals_to_gamma_max():
    values = [probe_weight(0.085, e, 10) for e in range(10)]
    assert all(v > 0 for v in values[1:]) and values[0] > 0
    assert values == sorted(values) and values[-1] == pytest.approx(0.085)
    assert values[4] == pytest.approx(0.085 * math.exp(-5 * (1 - 4 / 9) ** 2))
    assert probe_weight(0.05, 0, 1) == pytest.approx(0.05)


def test_npo_loss_matches_formula_and_is_log4_over_beta_at_the_reference():
    logp, ref = torch.tensor([-10.0, -3.0]), torch.tensor([-8.0, -3.0])
    beta = 0.1
    expected = -(2 / beta) * sum(math.log(1 / (1 + math.exp(beta * (a - b)))) for a, b in zip(logp, ref)) / 2
    assert float(npo_loss(logp, ref, beta)) == pytest.approx(expected, rel=1e-6)
    assert float(npo_loss(ref, ref, beta)) == pytest.approx(2 / beta * math.log(2), rel=1e-6)


def test_sequence_logprob_and_mean_nll_match_a_loop():
    torch.manual_seed(3)
    logits = torch.randn(2, 5, 7)
    ids = torch.randint(0, 7, (2, 5))
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    logp = torch.log_softmax(logits, -1)
    expected = [sum(float(logp[b, t - 1, ids[b, t]]) for t in range(1, 5) if mask[b, t]) for b in range(2)]
    assert torch.allclose(sequence_logprob(logits, ids, mask), torch.tensor(expected), atol=1e-5)
    assert float(mean_nll(logits, ids, mask)) == pytest.approx(-sum(expected) / 6, rel=1e-5)


def test_fgsm_probe_loss_matches_a_manual_computation():
    torch.manual_seed(4)
    probe = torch.nn.Linear(3, 2)
    h, y = torch.randn(5, 3), torch.tensor([0, 1, 1, 0, 1])
    hh = h.clone().requires_grad_(True)
    ce = torch.nn.functional.cross_entropy(probe(hh), y)
    (grad,) = torch.autograd.grad(ce, hh)
    adv = torch.nn.functional.cross_entropy(probe(h + 0.01 * grad.sign()), y)
    l1 = probe.weight.abs().sum() + probe.bias.abs().sum()
    expected = ce + 0.4 * adv + 1e-4 * l1
    assert fgsm_probe_loss(probe, h, y, 0.01, 0.4, 1e-4).item() == pytest.approx(expected.item(), rel=1e-6)


def test_rmu_loss_by_hand():
    h_f = torch.tensor([[[1.0, 1.0], [9.0, 9.0]]])  # second token is padding
    control = torch.tensor([0.0, 2.0])
    h_r, frozen = torch.tensor([[[1.0, 3.0]]]), torch.tensor([[[1.0, 1.0]]])
    loss = rmu_loss(h_f, control, h_r, frozen, alpha=10.0, forget_mask=torch.tensor([[1.0, 0.0]]),
                    retain_mask=torch.tensor([[1.0]]))
    assert float(loss) == pytest.approx((1 + 1) / 2 + 10 * (0 + 4) / 2)


# ---- metrics ---------------------------------------------------------------------------------------------------

def _lcs_brute(a, b):
    """Exact enumeration: the longest subsequence of `a` that is also a subsequence of `b`."""
    def is_subsequence(s, t):
        it = iter(t)
        return all(x in it for x in s)
    return max(n for n in range(len(a) + 1) for s in itertools.combinations(a, n) if is_subsequence(s, b))


@pytest.mark.parametrize("seed", range(6))
def test_lcs_matches_exhaustive_enumeration(seed):
    rng = torch.Generator().manual_seed(seed)
    a = [str(int(x)) for x in torch.randint(0, 3, (7,), generator=rng)]
    b = [str(int(x)) for x in torch.randint(0, 3, (6,), generator=rng)]
    assert lcs_length(a, b) == _lcs_brute(a, b)


def test_rouge_l_hand_cases():
    assert rouge_l("the cat sat on the mat", "the cat sat on the mat")["f1"] == 1.0
    score = rouge_l("the cat was on a mat", "the cat sat on the mat")  # LCS: the cat on mat = 4
    assert score["precision"] == pytest.approx(4 / 6) and score["recall"] == pytest.approx(4 / 6)
    assert rouge_l("", "anything")["f1"] == 0.0
    assert rouge_l("In 1472, Scotland.", "1472")["recall"] == 1.0


def test_min_k_auc_and_privleak():
    assert min_k_score(torch.tensor([-1.0, -5.0, -2.0, -4.0, -3.0]), 0.4) == pytest.approx(-4.5)
    assert min_k_score(torch.tensor([-1.0]), 0.4) == -1.0
    assert mia_auc([3.0, 2.0], [1.0, 0.0]) == 1.0
    assert mia_auc([1.0, 0.0], [3.0, 2.0]) == 0.0
    assert mia_auc([1.0, 3.0], [2.0, 0.0]) == pytest.approx(0.75)
    assert privleak(0.75, 0.5) == pytest.approx(50.0)


def test_batches_are_seeded_and_cover_every_window_each_epoch():
    epochs = [[i for step in range(e * 3, e * 3 + 3) for i in batch_indices(10, 4, step, seed=5)] for e in range(2)]
    for order in epochs:  # 4 + 4 + 2 windows per epoch: every window exactly once, no duplicates
        assert sorted(order) == list(range(10))
    assert [len(batch_indices(10, 4, step, 5)) for step in range(3)] == [4, 4, 2]
    assert epochs[0] != epochs[1]  # a fresh shuffle each epoch
    assert batch_indices(10, 4, 7, 5) == batch_indices(10, 4, 7, 5)
    batch = collate([torch.tensor([1, 2, 3]), torch.tensor([4])], pad=0)
    assert batch["input_ids"].tolist() == [[1, 2, 3], [4, 0, 0]] and batch["attention_mask"].sum() == 4


def test_knowmem_prompt_ends_at_the_answer_colon(monkeypatch):
    """A trailing space after 'Answer:' is a token the memorised text never has before its answer (BPE merges the
    space into the next word), so the prompt must end at the colon."""
    from toolkit.unlearn import evaluate as ev

    seen = []
    monkeypatch.setattr(ev, "continue_text", lambda model, tok, prompt, *a, **k: seen.append(prompt) or " Paris\nQ")
    score = ev.knowmem(None, None, [("Capital of France?", "Paris")], [("Q1?", "A1")],
                       ev.EvalConfig(model="m", verbmem="v.json"), "cpu")
    assert seen == ["Question: Q1?\nAnswer: A1\n\nQuestion: Capital of France?\nAnswer:"] and score == 100.0
