"""Baseline textual backdoor defenses run beside X-GRAAD.

STRIP (Gao et al. 2019, text form as in OpenBackdoor): perturb each input by replacing a share of its words with
words from clean held-out text; a trigger keeps the prediction fixed, so a LOW mean prediction entropy flags it.
ONION (Qi et al. 2021, arXiv 2011.10369): drop each word whose removal lowers a causal LM's perplexity by more
than a threshold (suspicion f_i = p0 - p_i), then classify the cleaned sentence.
"""

from __future__ import annotations

import math
import random
from typing import Sequence

import torch

from toolkit.core.errors import require
from toolkit.defend.attacks import predict


def entropy(probs: torch.Tensor) -> torch.Tensor:
    return -(probs * probs.clamp_min(1e-12).log()).sum(-1)


def strip_perturb(text: str, pool: Sequence[str], swap_ratio: float, rng: random.Random) -> str:
    words = text.split()
    if not words:
        return text
    count = max(1, int(round(swap_ratio * len(words))))
    for position in rng.sample(range(len(words)), min(count, len(words))):
        words[position] = rng.choice(pool)
    return " ".join(words)


def strip_entropy(model, tokenizer, texts: Sequence[str], clean_pool: Sequence[str], repeat: int = 5,
                  swap_ratio: float = 0.5, seed: int = 0, device: str = "cpu") -> list[float]:
    """Mean prediction entropy over `repeat` perturbed copies of each text."""
    rng = random.Random(seed)
    pool = [w for text in clean_pool for w in text.split()]
    require(len(pool) > 0, "STRIP needs clean text to draw replacement words from")
    copies = [strip_perturb(text, pool, swap_ratio, rng) for text in texts for _ in range(repeat)]
    values = entropy(predict(model, tokenizer, copies, device=device)).view(len(texts), repeat).mean(1)
    return values.tolist()


def strip_threshold(clean_entropies: Sequence[float], frr: float) -> float:
    """Entropy below which an input is flagged: the `frr` quantile of held-out clean entropies (false rejection rate)."""
    import numpy as np

    require(0.0 < frr < 1.0, f"STRIP false-rejection rate must be in (0, 1), got {frr}")
    return float(np.quantile(list(clean_entropies), frr))


@torch.no_grad()
def sentence_perplexities(lm, lm_tokenizer, sentences: Sequence[str], device: str = "cpu",
                          batch_size: int = 64) -> list[float]:
    """Perplexity of each sentence under a causal LM (a BOS/EOS token is prepended so one-word sentences score)."""
    if lm_tokenizer.pad_token is None:
        lm_tokenizer.pad_token = lm_tokenizer.eos_token
    lm_tokenizer.padding_side = "right"
    start_id = lm_tokenizer.bos_token_id if lm_tokenizer.bos_token_id is not None else lm_tokenizer.eos_token_id
    result = []
    for begin in range(0, len(sentences), batch_size):
        chunk = list(sentences[begin:begin + batch_size])
        enc = lm_tokenizer(chunk, return_tensors="pt", padding=True, add_special_tokens=False)
        ids = torch.cat([torch.full((len(chunk), 1), start_id), enc["input_ids"]], 1).to(device)
        mask = torch.cat([torch.ones(len(chunk), 1, dtype=torch.long), enc["attention_mask"]], 1).to(device)
        logits = lm(input_ids=ids, attention_mask=mask).logits.float()[:, :-1]
        nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
        target_mask = mask[:, 1:].float()
        mean = (nll * target_mask).sum(1) / target_mask.sum(1).clamp_min(1.0)
        result += [math.exp(min(v, 50.0)) for v in mean.tolist()]
    return result


def onion_clean(lm, lm_tokenizer, text: str, threshold: float = 0.0, device: str = "cpu") -> str:
    """Remove every word whose suspicion p0 - p_i exceeds the threshold."""
    words = text.split()
    if len(words) < 2:
        return text
    variants = [text] + [" ".join(words[:i] + words[i + 1:]) for i in range(len(words))]
    ppl = sentence_perplexities(lm, lm_tokenizer, variants, device)
    kept = [w for w, p_i in zip(words, ppl[1:]) if ppl[0] - p_i <= threshold]
    return " ".join(kept)
