"""Local Hugging Face causal LM backend: batched greedy/sampled generation, teacher-forced scoring, logits."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Sequence

import torch

from toolkit.llm.base import LLM, Completion, ScoredText, truncate_at_stop
from toolkit.models.adapters import cache_kwarg
from toolkit.nn.logprobs import token_logprobs


class HFBackend(LLM):
    capabilities = frozenset({"generate", "score", "chat_score", "logits", "token_logprobs"})

    def __init__(self, spec: str, device: str = "cpu", dtype=None, model=None, tokenizer=None, batch_size: int = 8):
        if model is None:
            from toolkit.models.source import load_model

            model, tokenizer = load_model(spec, device, dtype)
        self.model, self.tokenizer, self.device = model, tokenizer, device
        self.name, self.batch_size = spec, batch_size
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token

    def format(self, prompt: str, chat: bool) -> str:
        if chat and getattr(self.tokenizer, "chat_template", None):
            return self.tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                                      add_generation_prompt=True)
        return prompt

    @torch.no_grad()
    def generate(self, prompts: Sequence[str], max_new_tokens: int = 64, temperature: float = 0.0,
                 stop: Sequence[str] | None = None, seed: int = 0, chat: bool = False) -> list[Completion]:
        torch.manual_seed(seed)
        results: list[Completion] = []
        self.tokenizer.padding_side = "left"
        for start in range(0, len(prompts), self.batch_size):
            batch = [self.format(p, chat) for p in prompts[start:start + self.batch_size]]
            encoded = self.tokenizer(batch, return_tensors="pt", padding=True, add_special_tokens=False)
            encoded = {k: v.to(self.device) for k, v in encoded.items()}
            sample = temperature > 0
            output = self.model.generate(**encoded, max_new_tokens=max_new_tokens, do_sample=sample,
                                         temperature=temperature if sample else None, top_p=None, top_k=None,
                                         pad_token_id=self.tokenizer.pad_token_id, output_scores=True,
                                         return_dict_in_generate=True, **self._early_stop(stop))
            new_tokens = output.sequences[:, encoded["input_ids"].shape[1]:]
            logprobs = torch.stack(output.scores, 1).float().log_softmax(-1)
            chosen = logprobs.gather(-1, new_tokens.unsqueeze(-1)).squeeze(-1)
            for row in range(new_tokens.shape[0]):
                results.append(self._completion(new_tokens[row], chosen[row], stop))
        return results

    def _early_stop(self, stop: Sequence[str] | None) -> dict:
        """Stop decoding a row once its text holds a stop marker (the text is still cut at the marker after)."""
        markers = [marker for marker in stop or () if marker]
        return {"stop_strings": markers, "tokenizer": self.tokenizer} if markers else {}

    def _completion(self, tokens: torch.Tensor, logprobs: torch.Tensor, stop) -> Completion:
        keep = []
        eos = self.tokenizer.eos_token_id
        for token in tokens.tolist():
            if token == eos or token == self.tokenizer.pad_token_id:
                break
            keep.append(token)
        text = self.tokenizer.decode(keep, skip_special_tokens=True)
        cut = truncate_at_stop(text, stop)
        return Completion(text=cut, token_logprobs=logprobs[:len(keep)].tolist(),
                          tokens=[self.tokenizer.decode([t]) for t in keep],
                          finish_reason="stop" if len(keep) < len(tokens) or cut != text else "length")

    @torch.no_grad()
    def score(self, prompts: Sequence[str], continuations: Sequence[str], chat: bool = False) -> list[ScoredText]:
        return [self._score_one(self.format(p, chat), c) for p, c in zip(prompts, continuations, strict=True)]

    def _score_one(self, prompt: str, continuation: str) -> ScoredText:
        prompt_ids = self.tokenizer(prompt, add_special_tokens=False)["input_ids"]
        full_ids = self.tokenizer(prompt + continuation, add_special_tokens=False)["input_ids"]
        boundary = _common_prefix(prompt_ids, full_ids)
        ids = torch.tensor([full_ids], device=self.device)
        targets = ids[0, max(boundary, 1):]
        picked = token_logprobs(self.model(ids).logits[0, max(boundary, 1) - 1:-1], targets)
        return ScoredText(logprob=float(picked.sum()), token_logprobs=picked.tolist(),
                          tokens=[self.tokenizer.decode([t]) for t in targets.tolist()])

    @torch.no_grad()
    def score_choices(self, prompts: Sequence[str], choices: Sequence[str], chat: bool = False) -> list[list[float]]:
        """Same numbers as `score`, faster when the choices differ only in their last token (" positive" /
        " negative"): the prompts' shared token prefix is encoded once and reused through the KV cache, and all
        choices of a prompt are read from one forward pass. Other prompts take the teacher-forced path."""
        out: list[list[float]] = [[] for _ in prompts]
        rows = {}
        for i, prompt in enumerate(prompts):
            row = _layout(self.tokenizer, self.format(prompt, chat), choices)
            if row is None:
                out[i] = [s.logprob for s in self.score([prompt] * len(choices), choices, chat=chat)]
            else:
                rows[i] = row
        order = list(rows)
        for begin in range(0, len(order), self.batch_size):
            batch = order[begin:begin + self.batch_size]
            for i, values in zip(batch, _score_rows(self, [rows[i] for i in batch])):
                out[i] = values
        return out

    @torch.no_grad()
    def logits(self, text: str) -> torch.Tensor:
        ids = self.tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"].to(self.device)
        return self.model(ids).logits[0].float()


def _common_prefix(a: list[int], b: list[int]) -> int:
    """Token position where the continuation starts (merges across the boundary count to the continuation)."""
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


def _score_rows(llm: HFBackend, rows: list[_Row]) -> list[list[float]]:
    """Encode the batch's common token prefix once, then the rest of every row (right-padded: with causal
    attention a real token never sees the padding after it) on top of the cached prefix."""
    model = llm.model
    prefix = len(rows[0].shared)
    for row in rows:
        prefix = min(prefix, _common_prefix(rows[0].shared, row.shared), min(row.starts) - 1)
    cache_arg = cache_kwarg(model)
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
