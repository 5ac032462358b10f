"""Diagnostic for RESULTS.md: why X-GRAAD's psi separates poisoned from clean inputs only partly on this victim.

Re-scores the three sets of a finished `defend backdoor` evaluation (clean reference subset, clean dev subset,
poisoned dev inputs, read back from its decisions files) once, padded to L tokens, and recomputes psi with the
received attention summed over (a) the real token rows, (b) all L rows (padding rows included, the official code's
way), and with only the attention term or only the gradient ratio. Each variant's threshold is the 95th percentile
of ITS clean reference scores. It reads the poisoned test inputs, so it is a diagnostic, never a way to choose
settings. Usage: python examples/backdoor/psi_analysis.py runs/repro-backdoor [L ...]
"""

import json
import sys
from pathlib import Path

import numpy as np
import torch

from toolkit.defend.backdoor import attention_received, candidate_mask, padded_length, token_scores
from toolkit.defend.run import _subset, _texts
from toolkit.models.source import load_model


def ingredients(model, tokenizer, texts, length):
    """Per text: tokens, special flags, received attention over real rows and over all `length` rows, grad norms."""
    out = []
    for start in range(0, len(texts), 32):
        enc = tokenizer(texts[start:start + 32], return_tensors="pt", padding="max_length", max_length=length)
        emb = model.get_input_embeddings()(enc["input_ids"]).detach().requires_grad_(True)
        res = model(inputs_embeds=emb, attention_mask=enc["attention_mask"], token_type_ids=enc["token_type_ids"],
                    output_attentions=True)
        res.logits.gather(1, res.logits.argmax(-1, keepdim=True)).sum().backward()
        attentions = [a.detach() for a in res.attentions]
        real = attention_received(attentions, enc["attention_mask"])
        padded = attention_received(attentions, torch.ones_like(enc["attention_mask"]))
        for b in range(len(enc["input_ids"])):
            n = int(enc["attention_mask"][b].sum())
            ids = enc["input_ids"][b, :n].tolist()
            out.append((tokenizer.convert_ids_to_tokens(ids), [i in tokenizer.all_special_ids for i in ids],
                        real[b, :n], padded[b, :n], emb.grad[b, :n].norm(dim=-1)))
    return out


def psi(tokens, special, attention, grad):
    scores = token_scores(tokens, attention, grad, candidate_mask(tokens, special))
    return float(scores.max()), tokens[int(scores.argmax())]


def gradient_ratio(tokens, special, grad):
    """max_j g_j / mean_F g: the gradient factor of psi on its own."""
    keep = candidate_mask(tokens, special)
    ratio = grad[keep] / grad[keep].mean()
    return float(ratio.max()), [t for t, k in zip(tokens, keep) if k][int(ratio.argmax())]


def variant(rows: str, term: str):
    def score(item):
        tokens, special, real, padded, grad = item
        if term == "gradient only":
            return gradient_ratio(tokens, special, grad)
        attention = real if rows == "real" else padded
        return psi(tokens, special, attention, torch.ones_like(grad) if term == "attention only" else grad)
    return score


def main(run: str, lengths: list[int]) -> None:
    torch.set_num_threads(1)
    record = json.loads((Path(run) / "eval" / "run.json").read_text())
    config = record["config"]
    model, tokenizer = load_model(config["model"], "cpu", torch.float32, kind="seq-cls")
    model.set_attn_implementation("eager")
    sets = {"reference": _subset(*_texts(config["clean"]), config["max_clean"], record["seed"])[0],
            "clean dev": [json.loads(x)["text"] for x in open(Path(run) / "eval" / "decisions_clean.jsonl")],
            "poisoned": [json.loads(x)["text"] for x in open(Path(run) / "eval" / "decisions_poisoned.jsonl")]}
    trigger = config["eval_trigger"]
    longest = max(padded_length(tokenizer, texts) for texts in sets.values())
    print("| L | rows | score | clean dev over tau | poisoned over tau | trigger top-1 |\n|---|---|---|---:|---:|---:|")
    for length in [max(longest, L) for L in lengths]:
        data = {name: ingredients(model, tokenizer, texts, length) for name, texts in sets.items()}
        for rows, term in (("real", "psi"), ("padded", "psi"), ("real", "attention only"),
                           ("padded", "attention only"), ("-", "gradient only")):
            scored = {name: [variant(rows, term)(item) for item in items] for name, items in data.items()}
            tau = np.percentile([s for s, _ in scored["reference"]], 95)
            over = {name: np.mean([s >= tau for s, _ in values]) for name, values in scored.items()}
            top1 = np.mean([t == trigger for _, t in scored["poisoned"]])
            print(f"| {length} | {rows} | {term} | {over['clean dev']:.3f} | {over['poisoned']:.3f} | {top1:.3f} |")

if __name__ == "__main__":
    main(sys.argv[1], [int(x) for x in sys.argv[2:]] or [0])
