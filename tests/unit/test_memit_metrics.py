"""The official zsRE neighbourhood metric (per token, after `loc + "?"`) beside the strict one, on a stub model whose
argmax is a lookup table, so every figure is worked out by hand."""

from types import SimpleNamespace

import pytest
import torch

from toolkit.edit.facts import EditRequest
from toolkit.edit.metrics import evaluate, zsre_neighbourhood

VOCAB = ["<pad>", "nq", "question:", "who", "sang", "?", "x", "y", "z", "q", "Paris", "is", "in"]
ID = {w: i for i, w in enumerate(VOCAB)}
NEXT = {"sang": "q", "?": "x", "x": "q", "y": "z", "in": "Paris"}  # the stub's greedy next token


class StubTokenizer:
    pad_token_id = 0
    eos_token_id = 0

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [ID[w] for w in text.replace("?", " ? ").split()]}


class StubModel(torch.nn.Module):
    def forward(self, input_ids, attention_mask=None):
        logits = torch.zeros(*input_ids.shape, len(VOCAB))
        for b in range(input_ids.shape[0]):
            for t in range(input_ids.shape[1]):
                word = VOCAB[int(input_ids[b, t])]
                logits[b, t, ID[NEXT.get(word, "<pad>")]] = 1.0
        return SimpleNamespace(logits=logits)


def _facts():
    loc = "nq question: who sang"
    return [EditRequest(prompt="{} is in", subject="x", target_new="Paris", record_id="a",
                        neighborhood=[(loc, "x y z")]),
            EditRequest(prompt="{} is in", subject="y", target_new="Paris", record_id="b",
                        neighborhood=[(loc, "y")]),
            EditRequest(prompt="{} is in", subject="z", target_new="Paris", record_id="c",
                        neighborhood=[("z is in", "Paris")])]  # not a zsRE loc: left out of the official score


def test_official_zsre_neighbourhood_by_hand():
    # fact a: after "…sang ?" -> x (right), after x -> q (y wanted: wrong), after y -> z (right): 2/3
    # fact b: after "…sang ?" -> x (y wanted): 0;  mean over the two zsRE facts: (2/3 + 0) / 2 = 33.33 %
    rows = [{} for _ in range(3)]
    out = zsre_neighbourhood(StubModel(), StubTokenizer(), _facts(), 8, "cpu", rows)
    assert out == {"specificity_zsre_per_token": pytest.approx(33.33, abs=0.01)}
    assert rows[0]["specificity_zsre_per_token"] == pytest.approx(2 / 3) and rows[1] == {"specificity_zsre_per_token": 0}
    assert "specificity_zsre_per_token" not in rows[2]


def test_official_metric_sits_beside_the_strict_one():
    config = SimpleNamespace(eval_batch=4, fluency_samples=0)
    out = evaluate(StubModel(), StubTokenizer(), _facts(), config, "cpu", parts=("specificity",))
    # strict, prompt without "?": a: sang -> q wrong; b: wrong; c: "z is in" -> Paris right -> 1/3 of facts
    assert out["specificity"] == pytest.approx(33.33, abs=0.01)
    # lenient token accuracy without "?": a: q✗ q✗ z✓ = 1/3; b: 0; c: 1 -> (1/3 + 0 + 1) / 3 = 44.44 %
    assert out["specificity_token_acc"] == pytest.approx(44.44, abs=0.01)
    assert out["specificity_zsre_per_token"] == pytest.approx(33.33, abs=0.01)


def test_no_zsre_neighbourhood_gives_no_official_key():
    facts = _facts()[2:]
    assert zsre_neighbourhood(StubModel(), StubTokenizer(), facts, 8, "cpu") == {}
