"""Class-word scoring for MHLP's posterior predictive: log p(answer text of each class | task prompt).

`continuation_log_probs` returns, for every prompt, the log-probability of each of its candidate continuations,
exactly as `LLM.score` defines it (teacher-forced, the chat template when `chat`). Any backend that can score works
through `LLM.score`; a local Hugging Face backend takes a faster path that gives the same numbers: the prompts of a
batch share a long token prefix (chat template + system prompt θ + answer-format line), which is encoded once and
reused through the KV cache, and continuations that differ only in their last token (" positive" / " negative")
are read from one forward pass.
"""

from __future__ import annotations

import copy
import inspect
from dataclasses import dataclass
from typing import Sequence

import numpy as np


def continuation_log_probs(llm, prompts: Sequence[str], continuations: Sequence[str], chat: bool = False,
                           batch_size: int = 16) -> np.ndarray:
    """(len(prompts), len(continuations)) array of log p(continuation | prompt)."""
    if _has_local_model(llm):
        return _local_log_probs(llm, prompts, continuations, chat, batch_size)
    flat = llm.score([p for p in prompts for _ in continuations], [c for _ in prompts for c in continuations],
                     chat=chat)
    return np.array([s.logprob for s in flat], dtype=float).reshape(len(prompts), len(continuations))


def _has_local_model(llm) -> bool:
    return "logits" in getattr(llm, "capabilities", ()) and hasattr(llm, "model") and hasattr(llm, "tokenizer")


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@dataclass
class _Row:
    """One prompt's token layout: `shared` tokens common to all its continuations; each continuation scores tokens
    [start, len(shared)) of `shared` and then its own single `last` token."""

    shared: list[int]
    starts: list[int]
    lasts: list[int]


def _layout(tokenizer, text: str, continuations: Sequence[str]) -> _Row | None:
    """The `LLM.score` tokenization (prompt and prompt+continuation tokenized whole; a merge across the boundary
    belongs to the continuation), or None when the continuations do not differ in exactly their last token."""
    prompt_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    fulls = [tokenizer(text + c, add_special_tokens=False)["input_ids"] for c in continuations]
    shared = len(fulls[0])
    for ids in fulls[1:]:
        shared = min(shared, _common_prefix(fulls[0], ids))
    starts = [max(_common_prefix(prompt_ids, ids), 1) for ids in fulls]
    if any(len(ids) != shared + 1 or start > shared for ids, start in zip(fulls, starts)):
        return None
    return _Row(fulls[0][:shared], starts, [ids[shared] for ids in fulls])


def _local_log_probs(llm, prompts, continuations, chat: bool, batch_size: int) -> np.ndarray:
    import torch

    out = np.zeros((len(prompts), len(continuations)))
    rows = {}
    for i, prompt in enumerate(prompts):
        row = _layout(llm.tokenizer, llm.format(prompt, chat), continuations)
        if row is None:  # e.g. multi-token class words: the plain teacher-forced path
            out[i] = [s.logprob for s in llm.score([prompt] * len(continuations), continuations, chat=chat)]
        else:
            rows[i] = row
    order = list(rows)
    with torch.no_grad():
        for begin in range(0, len(order), batch_size):
            batch = order[begin:begin + batch_size]
            for i, values in zip(batch, _score_rows(llm, [rows[i] for i in batch])):
                out[i] = values
    return out


def _score_rows(llm, rows: list[_Row]) -> list[list[float]]:
    """Encode the batch's common token prefix once, then the rest of every row (right-padded: with causal
    attention a real token never sees the padding after it) on top of the cached prefix."""
    import torch

    model = llm.model
    prefix = len(rows[0].shared)
    for row in rows:
        prefix = min(prefix, _common_prefix(rows[0].shared, row.shared), min(row.starts) - 1)
    cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    extra = {}
    if prefix > 0:
        encoded = model(torch.tensor([rows[0].shared[:prefix]], device=llm.device), use_cache=True)
        cache = copy.deepcopy(getattr(encoded, cache_arg))
        cache.batch_repeat_interleave(len(rows))
        extra = {cache_arg: cache}
    length = max(len(row.shared) for row in rows) - prefix
    pad = llm.tokenizer.pad_token_id
    ids = torch.tensor([row.shared[prefix:] + [pad] * (length - len(row.shared) + prefix) for row in rows],
                       device=llm.device)
    logprobs = model(ids, use_cache=prefix > 0, **extra).logits.float().log_softmax(-1)
    results = []
    for b, row in enumerate(rows):
        # logits at batch position k predict token prefix + k + 1
        targets = torch.tensor(row.shared[prefix + 1:], device=llm.device)
        picked = logprobs[b, :len(targets)].gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        last = logprobs[b, len(row.shared) - prefix - 1]
        results.append([float(picked[start - prefix - 1:].sum() + last[token])
                        for start, token in zip(row.starts, row.lasts)])
    return results


def normalise(log_probs: np.ndarray) -> np.ndarray:
    """Softmax over the last axis: class probabilities from (unnormalised) class log-probabilities."""
    shifted = np.asarray(log_probs, float) - np.max(log_probs, axis=-1, keepdims=True)
    weights = np.exp(shifted)
    return weights / weights.sum(axis=-1, keepdims=True)


def model_average(per_sample_probs: Sequence[np.ndarray]) -> np.ndarray:
    """Bayesian model average: the posterior predictive p(y|x) ≈ (1/S) Σ_s p(y|x, θ_s) over the S posterior
    samples (repeated samples count once per occurrence, as MCMC draws do)."""
    return np.mean(np.stack(per_sample_probs), axis=0)


def class_probabilities(llm, system_prompt: str, questions: Sequence[str], classes: Sequence[str],
                        answer_template: str = "Answer: {}", chat: bool = False) -> np.ndarray:
    """(len(questions), len(classes)) p(class | question, θ): the task model's log-probability of the answer line
    `answer_template` filled with each class, after the task prompt, normalised over the classes."""
    from toolkit.prompt.mhlp import task_prompt

    prompts = [task_prompt(system_prompt, q) for q in questions]
    return normalise(continuation_log_probs(llm, prompts, [answer_template.format(c) for c in classes], chat))
