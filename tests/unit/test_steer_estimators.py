"""PCMS / UMS / ILCS against hand loops, split-half stability, the two operators, activations vs hidden_states."""

import pytest
import torch

from toolkit.core.errors import BadInputError
from toolkit.steer.estimators import cosine, estimate, ilcs_direction, pcms_direction, split_half_cosine, ums_direction
from toolkit.steer.evaluate import lexicon_rate, mean_kl
from toolkit.steer.intervene import clip_threshold, steer_fn


def test_estimators_match_hand_loops():
    torch.manual_seed(0)
    pos, neg = torch.randn(7, 5, dtype=torch.float64), torch.randn(7, 5, dtype=torch.float64)
    neg_unpaired = torch.randn(4, 5, dtype=torch.float64)
    hand_pcms = sum((pos[i] - neg[i]) for i in range(7)) / 7
    hand_ums = sum(pos[i] for i in range(7)) / 7 - sum(neg_unpaired[j] for j in range(4)) / 4
    assert torch.allclose(pcms_direction(pos, neg), hand_pcms)
    assert torch.allclose(ums_direction(pos, neg_unpaired), hand_ums)
    assert torch.allclose(ilcs_direction(pos, neg, 3), pos[3] - neg[3])
    assert torch.allclose(estimate("pcms", pos, neg), hand_pcms)
    # on the same paired sets, the mean of differences equals the difference of means
    assert torch.allclose(estimate("ums", pos, neg), hand_pcms)


@pytest.mark.parametrize("call", [
    lambda: pcms_direction(torch.zeros(3, 4), torch.zeros(2, 4)),
    lambda: pcms_direction(torch.zeros(0, 4), torch.zeros(0, 4)),
    lambda: ums_direction(torch.zeros(0, 4), torch.zeros(2, 4)),
    lambda: ilcs_direction(torch.zeros(2, 4), torch.zeros(2, 4), 5),
    lambda: estimate("mean", torch.zeros(2, 4), torch.zeros(2, 4)),
    lambda: split_half_cosine("pcms", torch.zeros(1, 4), torch.zeros(1, 4)),
])
def test_bad_example_sets_are_input_errors(call):
    with pytest.raises(BadInputError):
        call()


def _topic_data(n, d, seed, topic_scale=5.0, noise=0.3):
    """h = topic_i + (+-) c + noise: pairs share topic_i, so pairing cancels the large topic variance."""
    g = torch.Generator().manual_seed(seed)
    topics = topic_scale * torch.randn(n, d, generator=g)
    c = torch.zeros(d)
    c[0] = 1.0
    pos = topics + c + noise * torch.randn(n, d, generator=g)
    neg = topics - c + noise * torch.randn(n, d, generator=g)
    return pos, neg, c


def test_pcms_more_stable_than_ums_under_topic_variance():
    for n in (8, 32):
        pcms = sum(split_half_cosine("pcms", *_topic_data(n, 16, s)[:2], repeats=10, seed=s) for s in range(5)) / 5
        ums = sum(split_half_cosine("ums", *_topic_data(n, 16, s)[:2], repeats=10, seed=s) for s in range(5)) / 5
        assert pcms > ums + 0.3, (n, pcms, ums)
    pos, neg, c = _topic_data(32, 16, 0)
    assert cosine(pcms_direction(pos, neg), c) > 0.95


def test_split_half_of_identical_pairs_is_one():
    pos = torch.randn(6, 3)
    assert split_half_cosine("pcms", pos + torch.tensor([1.0, 0, 0]), pos, repeats=3) == pytest.approx(1.0)


def test_add_and_ablate_operators():
    torch.manual_seed(1)
    h, v = torch.randn(2, 3, 4), torch.randn(4)
    assert torch.allclose(steer_fn(v, 0.5, "add")(h), h - 0.5 * v)
    ablated = steer_fn(v, 1.0, "ablate")(h)
    assert torch.allclose(ablated @ v, torch.zeros(2, 3), atol=1e-5)
    unit = v / v.norm()
    assert torch.allclose(ablated, h - (h @ unit).unsqueeze(-1) * unit, atol=1e-6)
    with pytest.raises(BadInputError):
        steer_fn(torch.tensor([float("nan")]), 1.0)
    with pytest.raises(BadInputError):
        steer_fn(v, 1.0, "multiply")


def test_clip_operator_removes_only_the_excess_projection_by_hand():
    v = torch.tensor([0.0, 2.0])  # u = (0, 1): the projection is the second coordinate
    h = torch.tensor([[5.0, 3.0], [1.0, -4.0], [2.0, 0.5]])
    # threshold 0, alpha 1: positive projections go to 0, negative ones stay
    assert torch.allclose(steer_fn(v, 1.0, "clip")(h), torch.tensor([[5.0, 0.0], [1.0, -4.0], [2.0, 0.0]]))
    # threshold 1, alpha 0.5: 3 -> 3 - 0.5*(3-1) = 2; -4 and 0.5 are below 1 and untouched
    assert torch.allclose(steer_fn(v, 0.5, "clip", threshold=1.0)(h),
                          torch.tensor([[5.0, 2.0], [1.0, -4.0], [2.0, 0.5]]))
    # the threshold is the neutral examples' mean projection on u: (1 + 3) / 2
    assert clip_threshold(v, torch.tensor([[7.0, 1.0], [-2.0, 3.0]])) == pytest.approx(2.0)
    with pytest.raises(BadInputError):
        steer_fn(v, 1.0, "clip", threshold=float("inf"))


def test_mean_kl_and_lexicon_rate_by_hand():
    p = torch.tensor([[0.5, 0.5], [0.9, 0.1]]).log()
    q = torch.tensor([[0.25, 0.75], [0.9, 0.1]]).log()
    hand = (0.5 * torch.log(torch.tensor(0.5 / 0.25)) + 0.5 * torch.log(torch.tensor(0.5 / 0.75))) / 2
    assert mean_kl([p], [q]) == pytest.approx(float(hand), rel=1e-6)
    assert mean_kl([p], [p]) == 0.0
    assert lexicon_rate(["He stabbed the man", "a calm day"], ["stab", "kill"]) == pytest.approx(1 / 7)


def test_activations_match_hidden_states_and_steering_is_removed(tiny_llama_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from toolkit.steer.intervene import model_fingerprint, read_activations, steering

    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir).eval()
    tok = AutoTokenizer.from_pretrained(tiny_llama_dir)
    texts = ["def f(x): return x", "a longer sentence about the python language and its modules"]
    acts = read_activations(model, tok, texts, [0], "last", batch_size=2)
    means = read_activations(model, tok, texts, [0], "mean", batch_size=1)
    for i, text in enumerate(texts):
        ids = tok(text, return_tensors="pt")
        hidden = model(**ids, output_hidden_states=True).hidden_states[1][0]
        assert torch.allclose(acts[0][i], hidden[-1], atol=1e-5)
        assert torch.allclose(means[0][i], hidden.mean(0), atol=1e-5)
    ids = tok(texts[0], return_tensors="pt")
    before = model(**ids).logits
    v = torch.randn(model.config.hidden_size)
    with steering(model, [(1, v)], 2.0):
        steered = model(**ids, output_hidden_states=True)
    # two layers at once: block 0's output is shifted by -0.5w, and block 1's output (computed from that shifted
    # input) by -0.5v on top of what steering block 0 alone gives
    w = torch.randn(model.config.hidden_size)
    plain_acts = read_activations(model, tok, texts, [0, 1], "last")
    with steering(model, [(0, w), (1, v)], 0.5):
        both = read_activations(model, tok, texts, [0, 1], "last")
    with steering(model, [(0, w)], 0.5):
        only0 = read_activations(model, tok, texts, [0, 1], "last")
    assert torch.allclose(both[0], plain_acts[0] - 0.5 * w, atol=1e-5)
    assert torch.allclose(both[1], only0[1] - 0.5 * v, atol=1e-5)
    assert not torch.allclose(only0[1], plain_acts[1], atol=1e-3)
    with pytest.raises(BadInputError):
        with steering(model, [(0, w), (1, v)], 0.5, "clip", thresholds=[0.0]):
            pass
    plain = model(**ids, output_hidden_states=True)
    # the last hidden_states entry has the final norm applied, so compare the logits path instead
    assert not torch.allclose(steered.logits, before)
    assert torch.allclose(model(**ids).logits, before)
    assert torch.allclose(plain.logits, before)
    assert len(model_fingerprint(model)) == 16
