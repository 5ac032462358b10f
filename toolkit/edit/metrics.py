"""Editing metrics, strict and lenient (EAMET's "practical" metrics and MEMIT's probability metrics).

Strict: the teacher-forced greedy (argmax) prediction reproduces *every* token of the answer after the prompt.
- efficacy: rewrite prompt -> new object; generalization: paraphrases -> new object;
- specificity: neighbourhood prompts -> the answer they had (true object / zsRE loc answer);
- fluency: n-gram entropy of sampled generations (2- and 3-grams, weights 2/3 and 4/3, as MEMIT).
Lenient: token accuracy (share of answer tokens that are the argmax, MEMIT's zsRE metric), and where the true
object is known P(new) > P(true) (MEMIT's CounterFact "probs" metric, mean token log-probability).
Official zsRE neighbourhood (`specificity_zsre_per_token`, MEMIT/EAMET dsets/zsre.py + eval_utils_zsre.py): the
prompt is the NQ question `loc` + "?", each token of " " + loc_ans is predicted (argmax) after the earlier answer
tokens, a fact scores the share right, and facts are averaged; only zsRE neighbourhood prompts ("nq question: …").
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
    from toolkit.models.tokens import pad_id

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
    from toolkit.models.tokens import pad_id

    entropies = []
    for prompt in prompts:
        ids = torch.tensor([tokenizer(prompt)["input_ids"]], device=device)
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                             do_sample=True, top_k=5, pad_token_id=pad_id(tokenizer))
        entropies.append(ngram_entropy(tokenizer.decode(out[0], skip_special_tokens=True)))
    return round(sum(entropies) / len(entropies), 4) if entropies else float("nan")


def evaluate(model, tokenizer, facts: list[EditRequest], config, device, progress=None,
             parts=("efficacy", "generalization", "specificity", "portability", "fluency"),
             per_record: list[dict] | None = None) -> dict:
    """Strict (%) and lenient metrics of the model on the facts; per-request means, as the papers report.
    Portability (KnowEdit): prompts whose answer follows from the edit. `per_record`, when given, receives one
    dict per fact with its own scores (strict as 0/1 or a share of its prompts, token accuracy, log-prob)."""
    batch = config.eval_batch
    out: dict = {}
    rows = [{"record": f.record_id, "subject": f.subject, "target_new": f.target_new} for f in facts]
    if "efficacy" in parts:
        new = score_answers(model, tokenizer, [(f.text, f.target_new) for f in facts], batch, device)
        out["efficacy"] = _mean(r["strict"] for r in new)
        out["efficacy_token_acc"] = _mean(r["token_acc"] for r in new)
        for row, r in zip(rows, new):
            row.update(efficacy=float(r["strict"]), efficacy_token_acc=r["token_acc"], logp_new=r["logp"])
        with_true = [(i, f) for i, f in enumerate(facts) if f.target_true]
        if with_true:
            true = score_answers(model, tokenizer, [(f.text, f.target_true) for _, f in with_true], batch, device)
            out["efficacy_prob"] = _mean(new[i]["logp"] > t["logp"] for (i, _), t in zip(with_true, true))
            for (i, _), t in zip(with_true, true):
                rows[i]["logp_true"] = t["logp"]
    groups = {"generalization": [[(p, f.target_new) for p in f.paraphrases] for f in facts],
              "specificity": [list(f.neighborhood) for f in facts],
              "portability": [list(f.portability) for f in facts]}
    for name, pairs in groups.items():
        if name in parts:
            out.update(_grouped(model, tokenizer, pairs, batch, device, name, rows))
    if "specificity" in parts:
        out.update(zsre_neighbourhood(model, tokenizer, facts, batch, device, rows))
    if per_record is not None:
        per_record.extend(rows)
    if "fluency" in parts and config.fluency_samples > 0:
        prompts = [(f.generation_prompts or [f.text])[0] for f in facts[:config.fluency_samples]]
        out["fluency"] = fluency(model, tokenizer, prompts, config.fluency_tokens, device)
    return out


def _grouped(model, tokenizer, groups: list[list[tuple[str, str]]], batch, device, name: str,
             per_record: list[dict] | None = None) -> dict:
    """Per-request mean over its prompts, then the mean over requests that have any."""
    flat = [pair for group in groups for pair in group]
    if not flat:
        return {}
    scores = iter(score_answers(model, tokenizer, flat, batch, device))
    strict, token = [], []
    for index, group in enumerate(groups):
        if group:
            rows = [next(scores) for _ in group]
            strict.append(sum(r["strict"] for r in rows) / len(rows))
            token.append(sum(r["token_acc"] for r in rows) / len(rows))
            if per_record is not None:
                per_record[index].update({name: strict[-1], f"{name}_token_acc": token[-1]})
    return {name: _mean(strict), f"{name}_token_acc": _mean(token)}


ZSRE_LOC = "nq question:"


def zsre_neighbourhood(model, tokenizer, facts: list[EditRequest], batch: int, device,
                       per_record: list[dict] | None = None) -> dict:
    """The official zsRE neighbourhood score (module docstring): per fact the share of loc_ans tokens predicted
    right after `loc + "?"` and the earlier answer tokens, then the mean over facts that have a zsRE loc (%)."""
    groups = [[(prompt + "?", answer) for prompt, answer in f.neighborhood if prompt.startswith(ZSRE_LOC)]
              for f in facts]
    flat = [pair for group in groups for pair in group]
    if not flat:
        return {}
    scores = iter(score_answers(model, tokenizer, flat, batch, device))
    per_fact = []
    for index, group in enumerate(groups):
        if group:
            per_fact.append(sum(next(scores)["token_acc"] for _ in group) / len(group))
            if per_record is not None:
                per_record[index]["specificity_zsre_per_token"] = per_fact[-1]
    return {"specificity_zsre_per_token": _mean(per_fact)}


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


def write_per_record(path, before: list[dict], after: list[dict]) -> None:
    """results.jsonl: one line per fact, {record, subject, target_new, pre: {...}, post: {...}} (pre is absent when
    the unedited model was not scored)."""
    import json

    keys = ("record", "subject", "target_new")
    with open(path, "w", encoding="utf-8") as handle:
        for index, row in enumerate(after):
            line = {k: row[k] for k in keys}
            if before:
                line["pre"] = {k: v for k, v in before[index].items() if k not in keys}
            line["post"] = {k: v for k, v in row.items() if k not in keys}
            handle.write(json.dumps(line, ensure_ascii=False) + "\n")
