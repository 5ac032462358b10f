"""MHLP — Metropolis–Hastings through LLM proposals ("Textual Bayes", Ross et al., ICLR 2026).

Paper: https://arxiv.org/abs/2506.10060 · official code: https://github.com/layer6ai-labs/textual-bayes

The system prompt θ is the parameter. One MH step on one training example (x, y):
  1. the task model answers x with θ; a proposer critiques the answer and rewrites θ into θ' (proposal q(θ'|θ));
  2. log q(θ'|θ) and the reverse log q(θ|θ') (rewrite prompt rebuilt from θ') are teacher-forced scores;
  3. target = log prior(θ) [θ scored as the answer to a free-text meta-prompt] + β · log p(y | x, θ) [the gold
     answer substituted into the model's own "Answer: VALUE" line; format failure → FORMAT_FAILURE_LOGLIK];
  4. accept iff log U ≤ log α = Δ log prior + β Δ log lik + log q(θ|θ') − log q(θ'|θ).
Samples are chain[burn_in::thinning] of the chain *including* the initial θ; the posterior predictive is the
answer frequency over the sampled prompts.
With `chat=True` (instruct models) every prompt is sent as a user turn through the model's chat template and every
scored text (response, rewrite, θ under the meta-prompt) is scored as the assistant's reply, so generation and
scoring see the same formatting.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Hashable, Sequence

import numpy as np

FORMAT_FAILURE_LOGLIK = -9_999_999.0
ANSWER_FORMAT = ('The last line of your response must always and only be of the following format: '
                 '"Answer: VALUE" where VALUE is the answer.')
ANSWER_PATTERN = r"Answer:\s*(\S+)"
DEFAULT_META_PROMPT = ("Generate a good system prompt for a question-answering language model. The system prompt "
                       "must be concise and generic and work with any question.")
CRITIQUE_INSTRUCTION = ("Evaluate the attempted answer. Be smart, logical, and very critical. Do not solve the "
                        "question. Just provide concise feedback.")


# ----------------------------------------------------------------------------------------------------- MH math
def log_acceptance(log_prior_old: float, log_prior_new: float, log_lik_old: float, log_lik_new: float,
                   log_q_forward: float, log_q_reverse: float, beta: float) -> float:
    """log α for θ → θ'. `log_q_forward` = log q(θ'|θ), `log_q_reverse` = log q(θ|θ')."""
    return ((log_prior_new - log_prior_old) + beta * (log_lik_new - log_lik_old)
            + (log_q_reverse - log_q_forward))


def accept(log_alpha: float, uniform: float) -> bool:
    """MH rule: accept iff log U ≤ log α (U in (0, 1])."""
    return math.log(max(uniform, 1e-300)) <= log_alpha


def thin(chain: Sequence, burn_in: int, thinning: int) -> list:
    """The official slicing: chain[burn_in::thinning], where the chain includes the initial state."""
    return list(chain[burn_in::thinning])


@dataclass
class Proposal:
    state: Hashable
    log_q_forward: float
    log_q_reverse: float
    info: dict = field(default_factory=dict)


@dataclass
class ChainResult:
    states: list  # initial state first, then one state per step
    accepted: list[bool]
    log_alphas: list[float]

    @property
    def acceptance_rate(self) -> float:
        return float(np.mean(self.accepted)) if self.accepted else 0.0


def run_chain(initial, propose: Callable[[object, int], Proposal], log_target: Callable[[object, int], float],
              steps: int, rng: np.random.Generator) -> ChainResult:
    """Generic MH: `propose(state, step)` gives θ' with both proposal log-probs, `log_target(state, step)` the
    unnormalised log posterior (log prior + β log lik) on the step's example."""
    states, accepted, log_alphas = [initial], [], []
    current = initial
    for step in range(steps):
        proposal = propose(current, step)
        log_alpha = (log_target(proposal.state, step) - log_target(current, step)
                     + proposal.log_q_reverse - proposal.log_q_forward)
        ok = accept(log_alpha, float(rng.uniform(0.0, 1.0)))
        if ok:
            current = proposal.state
        states.append(current)
        accepted.append(ok)
        log_alphas.append(float(log_alpha))
    return ChainResult(states, accepted, log_alphas)


def empirical_distribution(samples: Sequence[Hashable], support: Sequence[Hashable]) -> np.ndarray:
    counts = Counter(samples)
    return np.array([counts[s] for s in support], dtype=float) / max(len(samples), 1)


def total_variation(p, q) -> float:
    return 0.5 * float(np.abs(np.asarray(p, float) - np.asarray(q, float)).sum())


def exact_posterior(log_prior: np.ndarray, log_lik: np.ndarray, beta: float) -> np.ndarray:
    """∝ p(θ)·L(θ)^β over a finite prompt set."""
    logits = np.asarray(log_prior, float) + beta * np.asarray(log_lik, float)
    weights = np.exp(logits - logits.max())
    return weights / weights.sum()


# ------------------------------------------------------------------------------------------ answers and votes
def parse_answer(response: str, pattern: str = ANSWER_PATTERN) -> str | None:
    """The VALUE of the last "Answer: VALUE" line (punctuation stripped), or None on a format failure."""
    matches = list(re.finditer(pattern, response))
    if not matches:
        return None
    return matches[-1].group(1).strip().strip(".,;:!\"'*").lower() or None


def vote_distribution(answers: Sequence[str | None], classes: Sequence[str]) -> np.ndarray:
    """Posterior predictive over `classes` from one answer per sampled prompt; an unparsed (or out-of-class)
    answer spreads its vote uniformly, as the official multiple-choice code does."""
    probs = np.zeros(len(classes))
    index = {c: i for i, c in enumerate(classes)}
    for answer in answers:
        if answer in index:
            probs[index[answer]] += 1.0
        else:
            probs += 1.0 / len(classes)
    return probs / max(len(answers), 1)


# ------------------------------------------------------------------------------------- LLM-backed components
def task_prompt(system_prompt: str, question: str) -> str:
    return f"{system_prompt}\n{ANSWER_FORMAT}\n\nQuestion: {question}\nResponse:"


def gold_loglik(scorer, system_prompt: str, question: str, response: str, gold: str,
                pattern: str = ANSWER_PATTERN, chat: bool = False) -> float:
    """log p(gold | x, θ, the model's own reasoning): substitute the gold answer for the last VALUE in the
    response and score only its tokens, as log p(reasoning + gold) − log p(reasoning) of the response text (the
    space before VALUE goes with the gold answer, as a BPE tokenizer merges it). A response without the answer
    line is a format failure."""
    matches = list(re.finditer(pattern, response))
    if not matches:
        return FORMAT_FAILURE_LOGLIK
    reasoning = response[:matches[-1].start(1)].rstrip()
    answer = response[len(reasoning):matches[-1].start(1)] + gold
    prompt = task_prompt(system_prompt, question)
    with_gold, without = scorer.score([prompt, prompt], [reasoning + answer, reasoning], chat=chat)
    return float(with_gold.logprob - (without.logprob if reasoning else 0.0))


def prior_logprob(scorer, system_prompt: str, meta_prompt: str, chat: bool = False) -> float:
    """log p(θ) = Σ token log-probs of θ as the answer to the meta-prompt."""
    if chat:
        return float(scorer.score([meta_prompt], [system_prompt], chat=True)[0].logprob)
    return float(scorer.score([f"{meta_prompt}\nSystem prompt:"], [" " + system_prompt])[0].logprob)


def critique_prompt(question: str, gold: str, response: str) -> str:
    return (f"{CRITIQUE_INSTRUCTION}\n\nQuestion: {question}\nCorrect answer: {gold}\n"
            f"Attempted answer: {response}\nFeedback:")


def rewrite_prompt(system_prompt: str, question: str, response: str, feedback: str, chat: bool = False) -> str:
    """The optimizer prompt; the proposal is the text the proposer writes between the tags (as plain text) or its
    whole reply (chat, where the reply cannot be started with the open tag)."""
    ending = ("Reply with the improved system prompt only." if chat
              else "Improved system prompt:\n<IMPROVED_VARIABLE>")
    return ("You are part of an optimization system that improves text. Rewrite the system prompt below using "
            "the feedback. The new prompt must be at most one short paragraph, generic and applicable to any "
            "question, and must not include formatting instructions for the last line.\n\n"
            f"System prompt: {system_prompt}\nQuestion: {question}\nModel response: {response}\n"
            f"Feedback: {feedback}\n\n{ending}")


CLOSE_TAG = "</IMPROVED_VARIABLE>"


@dataclass
class LLMProposer:
    """Critique → rewrite proposal with forward and reverse log-probs scored by the proposer."""

    task: object
    proposer: object
    temperature: float = 1.0
    max_response_tokens: int = 64
    max_prompt_tokens: int = 64
    seed: int = 0
    calls: int = 0
    chat: bool = False

    def respond(self, system_prompt: str, question: str) -> str:
        self.calls += 1
        return self.task.generate([task_prompt(system_prompt, question)], max_new_tokens=self.max_response_tokens,
                                  temperature=self.temperature, seed=self.seed + self.calls, chat=self.chat)[0].text

    def _optimizer_prompt(self, system_prompt: str, question: str, gold: str, response: str) -> str:
        feedback = self.proposer.generate([critique_prompt(question, gold, response)],
                                          max_new_tokens=self.max_response_tokens,
                                          temperature=0.0, stop=["\n\n"], chat=self.chat)[0].text.strip()
        return rewrite_prompt(system_prompt, question, response, feedback, self.chat)

    def propose(self, system_prompt: str, question: str, gold: str, response: str) -> Proposal:
        forward_prompt = self._optimizer_prompt(system_prompt, question, gold, response)
        self.calls += 1
        new = self.proposer.generate([forward_prompt], max_new_tokens=self.max_prompt_tokens,
                                     temperature=self.temperature, stop=[CLOSE_TAG], seed=self.seed + self.calls,
                                     chat=self.chat)
        new_prompt = new[0].text.strip() or system_prompt
        new_response = self.respond(new_prompt, question)
        reverse_prompt = self._optimizer_prompt(new_prompt, question, gold, new_response)
        # the plain-text proposal ends at the closing tag; a chat reply ends with the turn
        close = "" if self.chat else CLOSE_TAG
        log_q_forward, log_q_reverse = (s.logprob for s in self.proposer.score(
            [forward_prompt, reverse_prompt], [new_prompt + close, system_prompt + close], chat=self.chat))
        return Proposal(new_prompt, float(log_q_forward), float(log_q_reverse), {"response": new_response})


def mh_step(proposer: LLMProposer, scorer, theta: str, example: dict, beta: float, meta_prompt: str,
            rng: np.random.Generator, pattern: str = ANSWER_PATTERN,
            prior_cache: dict[str, float] | None = None) -> tuple[str, dict]:
    """One MHLP step on one example; returns the next state and a log record. The prior of a prompt does not
    change between steps, so `prior_cache` (prompt → log prior) saves rescoring the current θ."""
    question, gold = example["question"], str(example["answer"])
    response = proposer.respond(theta, question)
    proposal = proposer.propose(theta, question, gold, response)
    chat = proposer.chat
    old_lik = gold_loglik(scorer, theta, question, response, gold, pattern, chat)
    new_lik = gold_loglik(scorer, proposal.state, question, proposal.info["response"], gold, pattern, chat)
    cache = {} if prior_cache is None else prior_cache
    for prompt in (theta, proposal.state):
        if prompt not in cache:
            cache[prompt] = prior_logprob(scorer, prompt, meta_prompt, chat)
    old_prior, new_prior = cache[theta], cache[proposal.state]
    log_alpha = log_acceptance(old_prior, new_prior, old_lik, new_lik, proposal.log_q_forward,
                               proposal.log_q_reverse, beta)
    ok = accept(log_alpha, float(rng.uniform(0.0, 1.0)))
    record = {"proposal": proposal.state, "accepted": ok, "log_alpha": log_alpha, "log_lik_old": old_lik,
              "log_lik_new": new_lik, "log_prior_old": old_prior, "log_prior_new": new_prior,
              "log_q_forward": proposal.log_q_forward, "log_q_reverse": proposal.log_q_reverse}
    return (proposal.state if ok else theta), record


def predictive(task, prompts: Sequence[str], questions: Sequence[str], classes: Sequence[str],
               temperature: float, max_tokens: int, seed: int, pattern: str = ANSWER_PATTERN,
               chat: bool = False) -> tuple[np.ndarray, float]:
    """(n_questions, n_classes) answer frequencies, each sampled prompt answering each question once, and the
    fraction of answers that parsed into a class (the rest voted uniformly)."""
    rows, parsed = [], 0
    for qi, question in enumerate(questions):
        texts = task.generate([task_prompt(p, question) for p in prompts], max_new_tokens=max_tokens,
                              temperature=temperature, seed=seed + qi, chat=chat)
        answers = [parse_answer(c.text, pattern) for c in texts]
        parsed += sum(answer in classes for answer in answers)
        rows.append(vote_distribution(answers, classes))
    return np.stack(rows), parsed / max(len(questions) * len(prompts), 1)


def prompt_accuracies(task, prompts: Sequence[str], examples: Sequence[dict], max_tokens: int,
                      pattern: str = ANSWER_PATTERN, chat: bool = False) -> np.ndarray:
    """Greedy accuracy of each prompt on `examples` (the chain's training examples): picks the single best one."""
    hits = np.zeros(len(prompts))
    for example in examples:
        texts = task.generate([task_prompt(p, example["question"]) for p in prompts], max_new_tokens=max_tokens,
                              temperature=0.0, chat=chat)
        hits += [parse_answer(c.text, pattern) == str(example["answer"]) for c in texts]
    return hits / max(len(examples), 1)
