"""MHLP's config (torch-free: the CLI builds `iclrkit prompt mhlp` options from these fields)."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field

from toolkit.core.fields import data_field
from toolkit.llm.config import LLMClientConfig
from toolkit.prompt import mhlp


class MHLPConfig(LLMClientConfig):
    """Textual Bayes / MHLP (https://arxiv.org/abs/2506.10060, code layer6ai-labs/textual-bayes).

    Defaults follow conf/method/textual_bayes.yaml and mcmc/malangevin.yaml: 20 steps (one example each),
    burn-in 2, thinning 2, 1 chain, β = 100, task temperature 1. Extra chains restart from the initial prompt
    with their own seeds (the official code rewords it with an LLM first).

    Baselines, each answering every evaluation question as many times as there are posterior samples (T as the
    ensemble, answer frequencies): `single` = the single best prompt (highest greedy accuracy on the chain's
    training examples among the initial and the sampled prompts), `initial` = the initial prompt.

    `predictive="score"` (an option beyond the official code, for classification): instead of sampling one answer
    per prompt, each prompt gives class probabilities from the task model's log-probability of the answer line
    (`answer_template`) for every class, normalised over the classes; the ensemble is their Bayesian model average
    over the posterior samples, `single`/`initial` are that prompt's own probabilities, and the single best prompt
    is picked by accuracy on the chain examples (ties: mean gold log-probability). No generation, so evaluation is
    far cheaper."""

    task_model: str = Field(description="Model answering questions (path, zoo:NAME, openai:MODEL@URL).")
    proposer_model: str = Field(description="Critique/rewrite model; must score supplied text.")
    data: str = data_field(..., description="JSONL with question and answer.")
    initial_prompt: str = Field("You are a helpful assistant. Think step by step.",
                                description="Starting system prompt.")
    meta_prompt: str = Field(mhlp.DEFAULT_META_PROMPT, description="Free-text prior belief about good prompts.")
    beta: float = Field(100.0, ge=0, description="Likelihood temperature β.")
    steps: int = Field(20, ge=1, description="MH steps per chain (one example each).")
    burn_in: int = Field(2, ge=0, description="States dropped at the chain start.")
    thinning: int = Field(2, ge=1, description="Keep every k-th state.")
    chains: int = Field(1, ge=1, description="Independent chains.")
    # chain examples carved from the data (fixed seed)
    train_size: int = Field(20, ge=1, description="Chain examples.")
    # evaluation examples (disjoint from the chain examples)
    eval_size: int = Field(100, ge=1, description="Evaluation examples.")
    temperature: float = Field(1.0, ge=0)
    max_response_tokens: int = Field(64, ge=1)
    max_prompt_tokens: int = Field(64, ge=1)
    answer_pattern: str = mhlp.ANSWER_PATTERN
    classes: Optional[list[str]] = None  # answer labels; default: the distinct gold answers in the data
    predictive: Literal["sample", "score"] = Field(
        "sample", description="Posterior predictive: 'sample' (answer frequencies, official) or 'score' "
                              "(class-word log-probs averaged over the samples; classification).")
    answer_template: str = "Answer: {}"  # predictive="score": the scored answer line, {} = the class
    # needs a backend with capability "chat_score" (a local model)
    chat: bool = Field(False, description="Use the chat template for generation and scoring (instruct models; "
                                          "local models only).")
