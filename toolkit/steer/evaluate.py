"""Evaluation of a steering edit: the undesired category's probability (lexicon scorer and an embedding
classifier on the MiniLM encoder), KL to the unsteered model on neutral prompts, and neutral perplexity."""

from __future__ import annotations

import re
from typing import Sequence

import torch

from toolkit.core.errors import require
from toolkit.steer.intervene import encode


def lexicon_token_ids(tokenizer, words: Sequence[str]) -> list[int]:
    """Ids of lexicon words that are ONE token (with a leading space, lower or capitalised): only those make the
    next-token probability mass an exact probability of emitting a lexicon word."""
    ids: set[int] = set()
    for word in words:
        for form in {f" {word}", f" {word.capitalize()}"}:
            pieces = tokenizer(form, add_special_tokens=False)["input_ids"]
            if len(pieces) == 1:
                ids.add(pieces[0])
    require(bool(ids), "no lexicon word is a single token of this tokenizer", "add common words to the lexicon")
    return sorted(ids)


def lexicon_rate(texts: Sequence[str], words: Sequence[str]) -> float:
    """Share of the generated words that are lexicon words (prefix match, so 'stabbed' counts for 'stab')."""
    lexicon = tuple(w.lower() for w in words)
    tokens = [t for text in texts for t in re.findall(r"[a-z]+", text.lower())]
    return sum(t.startswith(lexicon) for t in tokens) / max(len(tokens), 1)


@torch.no_grad()
def generate(model, tokenizer, prompts: Sequence[str], max_new_tokens: int, lexicon_ids: Sequence[int] | None = None,
             batch_size: int = 16, device: str = "cpu") -> tuple[list[str], float]:
    """Greedy continuations, and the mean next-token probability mass on the lexicon over the generated steps
    (steps after an end-of-sequence token are not counted)."""
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    texts: list[str] = []
    mass_sum, mass_count = 0.0, 0
    for start in range(0, len(prompts), batch_size):
        tokenizer.padding_side = "left"
        batch = tokenizer(list(prompts[start:start + batch_size]), return_tensors="pt", padding=True).to(device)
        out = model.generate(**batch, max_new_tokens=max_new_tokens, do_sample=False, output_logits=True,
                             return_dict_in_generate=True, pad_token_id=tokenizer.pad_token_id)
        new = out.sequences[:, batch["input_ids"].shape[1]:]
        alive = torch.ones(new.shape[0], dtype=torch.bool, device=new.device)
        for step, logits in enumerate(out.logits):
            if lexicon_ids is not None:
                mass = logits.float().softmax(-1)[:, list(lexicon_ids)].sum(-1)
                mass_sum += float(mass[alive].sum())
                mass_count += int(alive.sum())
            alive &= new[:, step] != tokenizer.eos_token_id
        texts.extend(tokenizer.batch_decode(new, skip_special_tokens=True))
    tokenizer.padding_side = "right"
    return texts, mass_sum / max(mass_count, 1)


@torch.no_grad()
def next_token_logprobs(model, tokenizer, texts: Sequence[str], device: str = "cpu", batch_size: int = 16):
    """List of (tokens, vocab) log-probabilities for each text, padding removed."""
    from toolkit.steer.intervene import context_length

    result = []
    for start in range(0, len(texts), batch_size):
        batch = encode(tokenizer, texts[start:start + batch_size], context_length(model)).to(device)
        logprobs = model(**batch).logits.float().log_softmax(-1)
        for row, length in zip(logprobs, batch["attention_mask"].sum(1).tolist()):
            result.append(row[:length].cpu())
    return result


def mean_kl(reference: Sequence[torch.Tensor], steered: Sequence[torch.Tensor]) -> float:
    """Mean over all token positions of KL(p_reference || p_steered), in nats."""
    total, count = 0.0, 0
    for p_log, q_log in zip(reference, steered):
        total += float((p_log.exp() * (p_log - q_log)).sum())
        count += p_log.shape[0]
    return total / max(count, 1)


class EmbeddingClassifier:
    """Logistic regression on mean-pooled, L2-normalised sentence embeddings of a (MiniLM) encoder:
    P(undesired category | text)."""

    def __init__(self, encoder_dir: str, device: str = "cpu", max_length: int = 128):
        from transformers import AutoModel, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(encoder_dir)
        self.encoder = AutoModel.from_pretrained(encoder_dir).to(device).eval()
        self.device, self.max_length = device, max_length
        self.head = None

    @torch.no_grad()
    def embed(self, texts: Sequence[str], batch_size: int = 64) -> torch.Tensor:
        parts = []
        for start in range(0, len(texts), batch_size):
            batch = self.tokenizer(list(texts[start:start + batch_size]), return_tensors="pt", padding=True,
                                   truncation=True, max_length=self.max_length).to(self.device)
            hidden = self.encoder(**batch).last_hidden_state
            mask = batch["attention_mask"].unsqueeze(-1).float()
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp_min(1.0)
            parts.append(torch.nn.functional.normalize(pooled, dim=-1).cpu())
        return torch.cat(parts)

    def fit(self, undesired: Sequence[str], neutral: Sequence[str]) -> float:
        """Fit on the two sets; returns the training accuracy."""
        from sklearn.linear_model import LogisticRegression

        require(len(undesired) > 0 and len(neutral) > 0, "the category classifier needs both undesired and neutral texts")
        features = self.embed(list(undesired) + list(neutral)).numpy()
        labels = [1] * len(undesired) + [0] * len(neutral)
        self.head = LogisticRegression(C=10.0, max_iter=2000).fit(features, labels)
        return float(self.head.score(features, labels))

    def probability(self, texts: Sequence[str]) -> float:
        """Mean P(undesired) over the texts (an empty generation embeds as the [CLS]/[SEP] pair only)."""
        return float(self.head.predict_proba(self.embed(texts).numpy())[:, 1].mean())
