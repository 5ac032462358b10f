"""X-GRAAD: gradient-attention anomaly scoring to detect and neutralise textual backdoor triggers.

Paper: Das, Chen, Bhuyan, "Unmasking Backdoors: An Explainable Defense via Gradient-Attention Anomaly Scoring for
Pre-trained Language Models", arXiv 2510.04347 (https://arxiv.org/abs/2510.04347).
Official code: https://github.com/anindyasdas/XGRAAD. Difference from the official code: the detection threshold is
calibrated on a HELD-OUT clean split, never on the clean test split the results are reported on. Kept from the
official code: the received attention sums every query row of the padded input, padding rows included (it pads a
whole set to its longest text); here the clean reference and the screened texts share one padded length.
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from toolkit.core.errors import BadInputError, require

# The NLTK English stopword list (179 words), vendored because nltk data cannot be downloaded offline.
STOPWORDS = frozenset("""i me my myself we our ours ourselves you you're you've you'll you'd your yours yourself
yourselves he him his himself she she's her hers herself it it's its itself they them their theirs themselves what
which who whom this that that'll these those am is are was were be been being have has had having do does did doing
a an the and but if or because as until while of at by for with about against between into through during before
after above below to from up down in out on off over under again further then once here there when where why how all
any both each few more most other some such no nor not only own same so than too very s t can will just don don't
should should've now d ll m o re ve y ain aren aren't couldn couldn't didn didn't doesn doesn't hadn hadn't hasn
hasn't haven haven't isn isn't ma mightn mightn't mustn mustn't needn needn't shan shan't shouldn shouldn't wasn
wasn't weren weren't won won't wouldn wouldn't""".split())
SUBWORD_PREFIXES = ("##", "Ġ", "▁")  # BERT continuation, RoBERTa/DeBERTa word start, ALBERT/SentencePiece start


def split_prefix(token: str) -> tuple[str, str]:
    for prefix in SUBWORD_PREFIXES:
        if token.startswith(prefix):
            return prefix, token[len(prefix):]
    return "", token


def is_candidate(token: str, special: bool) -> bool:
    """The filter F of the paper: not a special token, stopword or punctuation. A '##' continuation piece is never a
    stopword (the official filter compares the raw BERT piece, e.g. '##s', with the stopword list)."""
    if special:
        return False
    prefix, body = split_prefix(token)
    if body == "" or all(ch in string.punctuation for ch in body):
        return False
    return prefix == "##" or body.lower() not in STOPWORDS


def candidate_mask(tokens: Sequence[str], special: Sequence[bool]) -> torch.Tensor:
    """Bool mask of F(x), every occurrence of a candidate token."""
    return torch.tensor([is_candidate(t, s) for t, s in zip(tokens, special)], dtype=torch.bool)


def token_scores(tokens: Sequence[str], attention: torch.Tensor, grad_norm: torch.Tensor,
                 candidates: torch.Tensor) -> torch.Tensor:
    """s_t = (a_t - mean_F a) * (g_t / mean_F g) for each distinct candidate token string t, placed at its
    highest-attention occurrence (-inf everywhere else). As in the official code, a_t and g_t are the largest
    attention and gradient norm over the occurrences of t, and the means run over every candidate occurrence."""
    scores = torch.full((len(tokens),), float("-inf"), dtype=torch.float64)
    positions = candidates.nonzero().flatten().tolist()
    if not positions:
        return scores
    a, g = attention.double(), grad_norm.double()
    mean_a, mean_g = a[positions].mean(), g[positions].mean().clamp_min(1e-30)
    occurrences: dict[str, list[int]] = {}
    for j in positions:
        occurrences.setdefault(tokens[j], []).append(j)
    for where in occurrences.values():
        first = max(where, key=lambda j: (float(a[j]), -j))  # highest attention, earliest on ties
        scores[first] = (a[where].max() - mean_a) * (g[where].max() / mean_g)
    return scores


def attention_received(attentions: Sequence[torch.Tensor], rows: torch.Tensor) -> torch.Tensor:
    """(B, T): column sums over the query rows marked in `rows` (B, T) of the attention averaged over all layers and
    heads: the attention each token receives."""
    mean = torch.stack([layer.float() for layer in attentions]).mean(dim=(0, 2))  # (B, T, T)
    return (mean * rows.unsqueeze(-1).float()).sum(1)


def padded_length(tokenizer, texts: Sequence[str]) -> int:
    """The longest tokenised text (special tokens included): the common length the official code pads a set to."""
    return max((len(ids) for ids in tokenizer(list(texts))["input_ids"]), default=0)


@dataclass
class Scored:
    tokens: list[str]
    ids: list[int]
    special: list[bool]
    label: int  # the model's prediction
    score: float  # psi(x) = max_j s_j (-inf when no candidate token)
    suspect: int  # argmax position (-1 when no candidate)


def score_batch(model, tokenizer, texts: Sequence[str], max_length: int = 256, device: str = "cpu",
                pad_to: Optional[int] = None) -> list[Scored]:
    """X-GRAAD anomaly score of each text: attention (eager, all layers/heads) x embedding-gradient norm of the
    predicted-class logit, each relative to its mean over the candidate tokens.

    pad_to=None counts only the real query rows in the received attention. pad_to=L pads every text to L tokens and
    counts all L rows, padding queries included, as the official code does (it pads a whole set to its longest text
    and sums the attention matrix over every row); padding rows still attend to the real tokens."""
    limit = min(max_length, getattr(model.config, "max_position_embeddings", max_length))
    longest = padded_length(tokenizer, texts)
    if max(longest, pad_to or 0) > limit:
        what = f"a text has {longest} tokens" if longest > limit else f"pad_to is {pad_to}"
        raise BadInputError(f"{what}, more than max_length {limit} (the model context is "
                            f"{getattr(model.config, 'max_position_embeddings', '?')})", "shorten the text")
    padding = {"padding": "max_length", "max_length": max(longest, pad_to)} if pad_to else {"padding": True}
    enc = tokenizer(list(texts), return_tensors="pt", truncation=False, **padding).to(device)
    embeddings = model.get_input_embeddings()(enc["input_ids"]).detach().requires_grad_(True)
    extra = {k: v for k, v in enc.items() if k not in ("input_ids",)}
    model.zero_grad(set_to_none=True)
    out = model(inputs_embeds=embeddings, output_attentions=True, **extra)
    if not out.attentions or out.attentions[0] is None:
        raise BadInputError("the model returns no attention weights",
                            "load it with attn_implementation='eager' (SDPA/flash attention return none)")
    predicted = out.logits.argmax(-1)
    out.logits.gather(1, predicted.unsqueeze(1)).sum().backward()
    grad_norm = embeddings.grad.norm(dim=-1).detach().cpu()
    rows = torch.ones_like(enc["attention_mask"]) if pad_to else enc["attention_mask"]
    received = attention_received([a.detach() for a in out.attentions], rows).cpu()
    special_ids = set(tokenizer.all_special_ids)
    results = []
    for b in range(len(texts)):
        length = int(enc["attention_mask"][b].sum())
        ids = enc["input_ids"][b, :length].tolist()
        tokens = tokenizer.convert_ids_to_tokens(ids)
        special = [i in special_ids for i in ids]
        scores = token_scores(tokens, received[b, :length], grad_norm[b, :length], candidate_mask(tokens, special))
        best = int(scores.argmax()) if torch.isfinite(scores).any() else -1
        results.append(Scored(tokens, ids, special, int(predicted[b]), float(scores[best]) if best >= 0 else float("-inf"), best))
    return results


def score_texts(model, tokenizer, texts: Sequence[str], batch_size: int = 32, max_length: int = 256,
                device: str = "cpu", progress=None, pad_to: Optional[int] = None) -> list[Scored]:
    starts = list(range(0, len(texts), batch_size))
    results: list[Scored] = []
    for start in (progress(starts, total=len(starts), description="x-graad") if progress else starts):
        results += score_batch(model, tokenizer, texts[start:start + batch_size], max_length, device, pad_to)
    return results


def percentile_threshold(clean_scores: Sequence[float], percentile: float = 95.0) -> float:
    """tau on the raw scores. The paper min-max normalises psi with the clean set's min and max first; that map is
    monotone increasing, so the flags are identical and the raw threshold is reported instead."""
    import numpy as np

    finite = [s for s in clean_scores if np.isfinite(s)]
    require(len(finite) > 0, "the clean reference set gives no finite score (every text is stopwords/punctuation)")
    require(0.0 < percentile < 100.0, f"percentile must be in (0, 100), got {percentile}")
    return float(np.percentile(finite, percentile))


def char_noise(token: str, rng: random.Random) -> str:
    """Corrupt a token by inserting or replacing 1-2 random letters, keeping its subword prefix; a body of at most
    two characters is deleted (returns '')."""
    prefix, body = split_prefix(token)
    if len(body) <= 2:
        return ""
    chars = list(body)
    for _ in range(rng.randint(1, 2)):
        letter = rng.choice(string.ascii_lowercase)
        if rng.random() < 0.5:
            chars.insert(rng.randint(0, len(chars)), letter)
        else:
            position = rng.randrange(len(chars))
            chars[position] = letter if chars[position] != letter else rng.choice(string.ascii_lowercase.replace(letter, ""))
    return prefix + "".join(chars)


def neutralised_text(tokenizer, scored: Scored, rng: random.Random) -> str:
    """The input with every occurrence of the suspect token character-noised (or deleted)."""
    suspect = scored.tokens[scored.suspect]
    noised = char_noise(suspect, rng)
    kept = [noised if tok == suspect else tok for tok, special in zip(scored.tokens, scored.special) if not special]
    return tokenizer.convert_tokens_to_string([t for t in kept if t != ""])


def defend(model, tokenizer, scored: Sequence[Scored], threshold: float, seed: int = 0, device: str = "cpu",
           max_length: int = 256) -> list[dict]:
    """Flag psi >= tau, neutralise the suspect token, re-classify: a flip keeps the flag and the new label,
    otherwise the flag is dropped and the original label kept."""
    from toolkit.defend.attacks import predict

    rng = random.Random(seed)
    flagged = [i for i, s in enumerate(scored) if s.suspect >= 0 and s.score >= threshold]
    rewritten = {i: neutralised_text(tokenizer, scored[i], rng) for i in flagged}
    new_labels = {}
    if flagged:
        probs = predict(model, tokenizer, [rewritten[i] for i in flagged], max_length=max_length, device=device)
        new_labels = dict(zip(flagged, probs.argmax(-1).tolist()))
    decisions = []
    for i, s in enumerate(scored):
        flipped = i in new_labels and new_labels[i] != s.label
        decisions.append({"score": s.score, "suspect": s.tokens[s.suspect] if s.suspect >= 0 else None,
                          "over_threshold": i in rewritten, "flagged": flipped, "label_before": s.label,
                          "label": new_labels[i] if flipped else s.label})
    return decisions
