"""MHLP math against hand computations and an exact finite-space posterior."""

import math

import numpy as np
import pytest

from toolkit.llm.base import Completion, ScoredText
from toolkit.prompt import mhlp
from toolkit.prompt.scripted import FinitePromptSpace


def test_log_acceptance_matches_hand_computation():
    # Δprior = -3 - (-5) = 2; β Δlik = 10 * (-0.2 - (-0.5)) = 3; log q(θ|θ') - log q(θ'|θ) = -4 - (-1.5) = -2.5
    value = mhlp.log_acceptance(log_prior_old=-5, log_prior_new=-3, log_lik_old=-0.5, log_lik_new=-0.2,
                                log_q_forward=-1.5, log_q_reverse=-4, beta=10)
    assert value == pytest.approx(2.5)
    assert mhlp.accept(value, 0.999) and mhlp.accept(-0.1, math.exp(-0.1) - 1e-9)
    assert not mhlp.accept(-0.1, math.exp(-0.1) + 1e-6)


def test_format_failure_forces_rejection():
    log_alpha = mhlp.log_acceptance(-10, 0, -1.0, mhlp.FORMAT_FAILURE_LOGLIK, -50, 0, beta=100)
    assert log_alpha < -1e8 and not mhlp.accept(log_alpha, 1e-12)


class FakeScorer:
    """-0.25 per character of each continuation; records every call."""

    def __init__(self):
        self.calls = []

    def score(self, prompts, continuations, chat=False):
        self.calls.append((list(prompts), list(continuations), chat))
        return [ScoredText(-0.25 * len(c), [], []) for c in continuations]


@pytest.mark.parametrize("chat", [False, True])
def test_gold_loglik_substitutes_gold_into_own_response_format(chat):
    scorer = FakeScorer()
    value = mhlp.gold_loglik(scorer, "Be careful.", "2+2?", "I think\nAnswer: 5", "42", chat=chat)
    assert value == pytest.approx(-0.25 * len(" 42"))  # only the gold answer (with its leading space) counts
    prompts, continuations, used_chat = scorer.calls[0]
    assert continuations == ["I think\nAnswer: 42", "I think\nAnswer:"] and used_chat == chat
    assert prompts[0] == prompts[1] and prompts[0].endswith("Response:") and "Be careful." in prompts[0]
    assert mhlp.gold_loglik(scorer, "p", "q", "no answer line", "4") == mhlp.FORMAT_FAILURE_LOGLIK


def test_thinning_keeps_initial_state_like_the_official_code():
    chain = list(range(21))  # initial θ + 20 steps
    assert mhlp.thin(chain, burn_in=2, thinning=2) == [2, 4, 6, 8, 10, 12, 14, 16, 18, 20]
    assert len(mhlp.thin(chain, 2, 2)) == 10


def test_vote_distribution_and_parse():
    assert mhlp.parse_answer("reasoning\nAnswer: Yes.") == "yes"
    assert mhlp.parse_answer("no format") is None
    assert mhlp.parse_answer("**Answer:** Positive") is None and mhlp.parse_answer("Answer: **Positive**") == "positive"
    probs = mhlp.vote_distribution(["yes", "yes", None, "maybe"], ["no", "yes"])
    assert probs == pytest.approx([0.25, 0.75])


def test_exact_posterior_and_total_variation():
    post = mhlp.exact_posterior([0.0, math.log(2)], [0.0, 0.0], beta=100)
    assert post == pytest.approx([1 / 3, 2 / 3])
    assert mhlp.total_variation([1, 0], [0.5, 0.5]) == pytest.approx(0.5)


def test_scripted_chain_reaches_known_posterior():
    space = FinitePromptSpace.random(6, beta=100.0, seed=0)
    samples = []
    for chain in range(4):
        result = space.sample(5000, seed=chain, initial=chain)
        assert 0 < result.acceptance_rate < 1
        samples += mhlp.thin(result.states, 100, 1)
    tv = mhlp.total_variation(mhlp.empirical_distribution(samples, range(6)), space.posterior())
    assert tv < 0.05


def test_chain_with_wrong_reverse_term_is_biased():
    """Dropping the Hastings correction for an asymmetric q must move the chain away from the posterior."""
    space = FinitePromptSpace([0, 0], [0, 0], [[0.1, 0.9], [0.1, 0.9]], beta=1.0)
    rng = np.random.default_rng(0)
    naive = mhlp.run_chain(0, lambda s, t: mhlp.Proposal(int(rng.choice(2, p=[0.1, 0.9])), 0.0, 0.0),
                           lambda s, t: 0.0, 4000, rng)
    corrected = space.sample(4000, seed=0)
    naive_tv = mhlp.total_variation(mhlp.empirical_distribution(naive.states, [0, 1]), [0.5, 0.5])
    corrected_tv = mhlp.total_variation(mhlp.empirical_distribution(corrected.states, [0, 1]), [0.5, 0.5])
    assert corrected_tv < 0.05 < naive_tv


class ScriptedLLM:
    """Answers by rule, scores with a fixed per-character log-prob: enough to check one mh_step by hand."""

    name = "scripted"

    def __init__(self):
        self.chat_flags = set()

    def generate(self, prompts, max_new_tokens=64, temperature=0.0, stop=None, seed=0, chat=False):
        self.chat_flags.add(chat)
        out = []
        for p in prompts:
            if p.endswith("Response:"):
                out.append(Completion("Answer: yes" if "careful" in p else "Answer: no"))
            elif p.endswith("Feedback:"):
                out.append(Completion("be more careful"))
            else:
                out.append(Completion("Be careful."))
        return out

    def score(self, prompts, continuations, chat=False):
        self.chat_flags.add(chat)
        return [ScoredText(-0.1 * len(c), [], []) for c in continuations]


@pytest.mark.parametrize("chat", [False, True])
def test_mh_step_record_is_consistent(chat):
    llm = ScriptedLLM()
    agent = mhlp.LLMProposer(llm, llm, chat=chat)
    theta, record = mhlp.mh_step(agent, llm, "Hi.", {"question": "ok?", "answer": "yes"}, beta=100,
                                 meta_prompt="meta", rng=np.random.default_rng(0))
    expected = mhlp.log_acceptance(record["log_prior_old"], record["log_prior_new"], record["log_lik_old"],
                                   record["log_lik_new"], record["log_q_forward"], record["log_q_reverse"], 100)
    assert record["log_alpha"] == pytest.approx(expected)
    prior_text = "Be careful." if chat else " Be careful."  # a chat reply has no leading space
    assert record["proposal"] == "Be careful." and record["log_prior_new"] == pytest.approx(-0.1 * len(prior_text))
    # forward proposal = the rewrite (+ the closing tag in plain text), scored by the proposer
    assert record["log_q_forward"] == pytest.approx(-0.1 * len("Be careful." + ("" if chat else mhlp.CLOSE_TAG)))
    assert theta == ("Be careful." if record["accepted"] else "Hi.")
    assert llm.chat_flags == {chat}  # every generation and score used the same formatting


def test_prompt_accuracies_pick_the_best_prompt():
    llm = ScriptedLLM()
    examples = [{"question": "a?", "answer": "yes"}, {"question": "b?", "answer": "yes"}]
    assert mhlp.prompt_accuracies(llm, ["Hi.", "Be careful."], examples, 8).tolist() == [0.0, 1.0]


def test_predictive_reports_the_parsed_fraction():
    llm = ScriptedLLM()  # "Hi." answers no, "Be careful." answers yes
    probs, rate = mhlp.predictive(llm, ["Hi.", "Be careful."], ["q?"], ["no", "yes"], 1.0, 8, seed=0)
    assert probs.tolist() == [[0.5, 0.5]] and rate == 1.0
    probs, rate = mhlp.predictive(llm, ["Hi.", "Be careful.", "Be careful."], ["q?"], ["yes", "maybe"], 1.0, 8, 0)
    assert probs[0].tolist() == pytest.approx([2 / 3 + 1 / 6, 1 / 6]) and rate == pytest.approx(2 / 3)
