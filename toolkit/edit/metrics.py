"""Editing metrics, strict and lenient (EAMET's "practical" metrics and MEMIT's probability metrics).

Strict: the teacher-forced greedy (argmax) prediction reproduces *every* token of the answer after the prompt.
- efficacy: rewrite prompt -> new object; generalization: paraphrases -> new object;
- specificity: neighbourhood prompts -> the answer they had (true object / zsRE loc answer);
- fluency: n-gram entropy of sampled generations (2- and 3-grams, weights 2/3 and 4/3, as MEMIT).
Lenient: token accuracy (share of answer tokens that are the argmax, MEMIT's zsRE metric), and where the true
object is known P(new) > P(true) (MEMIT's CounterFact "probs" metric, mean token log-probability).
"""

from __future__ import annotations

import math
import re
from collections import Counter

import torch

from toolkit.edit.facts import EditRequest


def ngram_entropy(text: str, ns=(2, 3), weights=(2 / 3, 4 / 3)) -> float:
    """Weighted mean over n of the entropy (bits) of the n-gram distribution of the text's word tokens."""
    words = re.findall(r"\w+|[^\w\s]", text.lower())
    values = []
    for n, weight in zip(ns, weights):
        grams = Counter(tuple(words[i:i + n]) for i in range(len(words) - n + 1))
        total = sum(grams.values())
        entropy = -sum(c / total * math.log2(c / total) for c in grams.values()) if total else 0.0
        values.append(weight * entropy)
    return sum(values) / len(values)


@torch.no_grad()
def score_answers(model, tokenizer, pairs: list[tuple[str, str]], batch: int, device) -> list[dict]:
    """For each (prompt, answer): strict (all argmax tokens right), token accuracy, mean answer log-prob."""
    from toolkit.edit.memit import pad_id

    encoded = []
    for prompt, answer in pairs:
        prompt_ids = tokenizer(prompt)["input_ids"]
        answer_ids = tokenizer(" " + answer.strip(), add_special_tokens=False)["input_ids"] or [pad_id(tokenizer)]
        encoded.append((prompt_ids, answer_ids))
    results = []
    for start in range(0, len(encoded), batch):
        chunk = encoded[start:start + batch]
        width = max(len(p) + len(a) - 1 for p, a in chunk)
        ids = torch.full((len(chunk), width), pad_id(tokenizer), dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, (p, a) in enumerate(chunk):
            seq = p + a[:-1]
            ids[i, :len(seq)] = torch.tensor(seq)
            mask[i, :len(seq)] = 1
        logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits.float()
        for i, (p, a) in enumerate(chunk):
            span = logits[i, len(p) - 1:len(p) - 1 + len(a)]
            answer = torch.tensor(a, device=span.device)
            hits = span.argmax(-1) == answer
            logp = torch.log_softmax(span, -1).gather(1, answer[:, None]).mean()
            results.append({"strict": bool(hits.all()), "token_acc": float(hits.float().mean()),
                            "logp": float(logp)})
    return results


def _mean(values) -> float:
    values = list(values)
    return round(100.0 * sum(values) / len(values), 2) if values else float("nan")


@torch.no_grad()
def fluency(model, tokenizer, prompts: list[str], max_new_tokens: int, device) -> float:
    from toolkit.edit.memit import pad_id

    entropies = []
    for prompt in prompts:
        ids = torch.tensor([tokenizer(prompt)["input_ids"]], device=device)
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                             do_sample=True, top_k=5, pad_token_id=pad_id(tokenizer))
        entropies.append(ngram_entropy(tokenizer.decode(out[0], skip_special_tokens=True)))
    return round(sum(entropies) / len(entropies), 4) if entropies else float("nan")


def evaluate(model, tokenizer, facts: list[EditRequest], config, device, progress=None,
             parts=("efficacy", "generalization", "specificity", "fluency")) -> dict:
    """Strict (%) and lenient metrics of the model on the facts; per-request means, as the papers report."""
    batch = config.eval_batch
    out: dict = {}
    if "efficacy" in parts:
        new = score_answers(model, tokenizer, [(f.text, f.target_new) for f in facts], batch, device)
        out["efficacy"] = _mean(r["strict"] for r in new)
        out["efficacy_token_acc"] = _mean(r["token_acc"] for r in new)
        with_true = [(i, f) for i, f in enumerate(facts) if f.target_true]
        if with_true:
            true = score_answers(model, tokenizer, [(f.text, f.target_true) for _, f in with_true], batch, device)
            out["efficacy_prob"] = _mean(new[i]["logp"] > t["logp"] for (i, _), t in zip(with_true, true))
    if "generalization" in parts:
        out.update(_grouped(model, tokenizer, [[(p, f.target_new) for p in f.paraphrases] for f in facts],
                            batch, device, "generalization"))
    if "specificity" in parts:
        out.update(_grouped(model, tokenizer, [list(f.neighborhood) for f in facts], batch, device, "specificity"))
    if "fluency" in parts and config.fluency_samples > 0:
        prompts = [(f.generation_prompts or [f.text])[0] for f in facts[:config.fluency_samples]]
        out["fluency"] = fluency(model, tokenizer, prompts, config.fluency_tokens, device)
    return out


def _grouped(model, tokenizer, groups: list[list[tuple[str, str]]], batch, device, name: str) -> dict:
    """Per-request mean over its prompts, then the mean over requests that have any."""
    flat = [pair for group in groups for pair in group]
    if not flat:
        return {}
    scores = iter(score_answers(model, tokenizer, flat, batch, device))
    strict, token = [], []
    for group in groups:
        if group:
            rows = [next(scores) for _ in group]
            strict.append(sum(r["strict"] for r in rows) / len(rows))
            token.append(sum(r["token_acc"] for r in rows) / len(rows))
    return {name: _mean(strict), f"{name}_token_acc": _mean(token)}


def alignment_spearman(keys: torch.Tensor, deltas: torch.Tensor, max_items: int = 500) -> float:
    """Spearman correlation between pairwise cos(k_i, k_j) and cos(δ_i, δ_j) (EAMET's Finding 1)."""
    keys, deltas = keys[:max_items].float(), deltas[:max_items].float()
    if keys.shape[0] < 3:
        return float("nan")
    sk = torch.nn.functional.normalize(keys, dim=-1)
    sd = torch.nn.functional.normalize(deltas, dim=-1)
    upper = torch.triu_indices(keys.shape[0], keys.shape[0], offset=1)
    a, b = (sk @ sk.t())[upper[0], upper[1]], (sd @ sd.t())[upper[0], upper[1]]
    ra, rb = _ranks(a), _ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    return round(float((ra * rb).sum() / (ra.norm() * rb.norm()).clamp_min(1e-12)), 4)


def _ranks(x: torch.Tensor) -> torch.Tensor:
    order = torch.argsort(x)
    ranks = torch.empty_like(x)
    ranks[order] = torch.arange(len(x), dtype=x.dtype)
    return ranks
