"""Fact loaders (ROME CounterFact, zsRE, EasyEdit, simple JSONL), bad records, and the metrics on hand-made cases."""

import json
import math

import pytest
import torch

from toolkit.core.errors import BadInputError
from toolkit.edit.facts import load_facts
from toolkit.edit.metrics import alignment_spearman, ngram_entropy, score_answers

# First records of shared/data's CounterFact sample (ROME format), zsRE MEND train split and EasyEdit's
# kd-evaluate CounterFact, trimmed to the fields the loaders read, so the test does not need shared/.
ROME_COUNTERFACT = {
    "case_id": 0, "requested_rewrite": {
        "prompt": "The mother tongue of {} is", "relation_id": "P103", "target_new": {"str": "English", "id": "Q1860"},
        "target_true": {"str": "French", "id": "Q150"}, "subject": "Danielle Darrieux"},
    "paraphrase_prompts": ["Shayna does this and Yossel goes still and dies. Danielle Darrieux, a native",
                           "An album was recorded for Capitol Nashville but never released. Danielle Darrieux spoke "
                           "the language"],
    "neighborhood_prompts": ["The mother tongue of Léon Blum is", "The native language of Montesquieu is"],
    "attribute_prompts": ["J. R. R. Tolkien is a native speaker of"],
    "generation_prompts": ["Danielle Darrieux's mother tongue is"]}
ZSRE_MEND = {"subject": "UniFirst", "src": "What is the product made by UniFirst?", "pred": "uniform",
             "rephrase": "What will be the product of UniFirst?", "alt": "unmanned aircraft", "answers": ["uniform"],
             "loc": "nq question: john goodman's character in the big lebowski", "loc_ans": "Walter Sobchak",
             "cond": "uniform >> unmanned aircraft || What is the product made by UniFirst?"}
EASYEDIT_COUNTERFACT = {"case_id": 13592, "prompt": "Yoruba religion is a part of the continent of",
                        "subject": "Yoruba religion", "ground_truth": "Africa", "target_new": "Antarctica",
                        "rephrase_prompt": "Arte, socialità, politica. Yoruba religion is located in",
                        "locality_prompt": "Algeria is located in", "locality_ground_truth": "Africa"}


def _write(path, records):
    path.write_text(json.dumps(records))
    return str(path)


def test_loads_rome_counterfact_zsre_and_easyedit(tmp_path):
    cf = load_facts(_write(tmp_path / "cf.json", [ROME_COUNTERFACT]))[0]
    assert (cf.prompt, cf.subject, cf.target_new, cf.target_true) == ("The mother tongue of {} is",
                                                                       "Danielle Darrieux", "English", "French")
    assert len(cf.paraphrases) == 2 and cf.neighborhood[0] == ("The mother tongue of Léon Blum is", "French")
    zsre = load_facts(_write(tmp_path / "zsre.json", [ZSRE_MEND] * 5), limit=3)
    assert len(zsre) == 3
    zsre = zsre[0]
    assert zsre.prompt == "What is the product made by {}?" and zsre.target_new == "unmanned aircraft"
    assert zsre.neighborhood[0][1] == "Walter Sobchak"
    easy = load_facts(_write(tmp_path / "easy.json", [EASYEDIT_COUNTERFACT]))[0]
    assert easy.text == "Yoruba religion is a part of the continent of" and easy.target_true == "Africa"
    assert easy.neighborhood == [("Algeria is located in", "Africa")]


def test_simple_jsonl(tmp_path):
    path = tmp_path / "facts.jsonl"
    path.write_text(json.dumps({"prompt": "Paris is the capital of", "subject": "Paris", "target_new": "Italy",
                                "neighborhood": [{"prompt": "Rome is in", "answer": "Italy"}]}) + "\n")
    fact = load_facts(path)[0]
    assert fact.prompt == "{} is the capital of" and fact.neighborhood == [("Rome is in", "Italy")]


@pytest.mark.parametrize("line, message", [
    ({"prompt": "Rome is nice", "subject": "Paris", "target_new": "x"}, "subject 'Paris' not found"),
    ({"prompt": "{} is", "subject": "Paris", "target_new": " "}, "empty target_new"),
    ({"foo": 1}, "unknown fact schema"),
])
def test_bad_records_name_the_record(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"prompt": "{} is", "subject": "A", "target_new": "B"}) + "\n" + json.dumps(line))
    with pytest.raises(BadInputError, match=message) as info:
        load_facts(path)
    assert "bad.jsonl:2" in str(info.value)


def test_malformed_json_names_the_line(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('[{"prompt": "{} is", "subject": "A",\n "target_new": }]')
    with pytest.raises(BadInputError, match="malformed JSON at line 2"):
        load_facts(path)


def test_ngram_entropy_by_hand():
    # "a b a b": bigrams ab, ba, ab -> H2 = H(2/3, 1/3); trigrams aba, bab -> H3 = 1 bit
    h2 = -(2 / 3 * math.log2(2 / 3) + 1 / 3 * math.log2(1 / 3))
    assert math.isclose(ngram_entropy("a b a b"), (2 / 3 * h2 + 4 / 3 * 1.0) / 2)
    assert ngram_entropy("x x x x x") == 0.0


class _Oracle(torch.nn.Module):
    """Predicts the next token of one memorised sequence (logit 10) and token 0 otherwise."""

    def __init__(self, sequence, vocab):
        super().__init__()
        self.sequence, self.vocab = list(sequence), vocab

    def forward(self, input_ids, attention_mask=None):
        logits = torch.zeros(*input_ids.shape, self.vocab)
        logits[..., 0] = 1.0
        for b, row in enumerate(input_ids.tolist()):
            for t in range(len(row)):
                if row[:t + 1] == self.sequence[:t + 1] and t + 1 < len(self.sequence):
                    logits[b, t, self.sequence[t + 1]] = 10.0
        return type("Out", (), {"logits": logits})()


def test_strict_and_lenient_scores_on_hand_made_model(tiny_tokenizer):
    prompt, answer = "The value of", "return"
    ids = tiny_tokenizer(prompt)["input_ids"] + tiny_tokenizer(" " + answer, add_special_tokens=False)["input_ids"]
    assert len(ids) - len(tiny_tokenizer(prompt)["input_ids"]) >= 2
    model = _Oracle(ids, len(tiny_tokenizer))
    right, wrong = score_answers(model, tiny_tokenizer, [(prompt, answer), (prompt, "xyzzy")], 4, "cpu")
    assert right["strict"] and right["token_acc"] == 1.0
    assert not wrong["strict"] and wrong["token_acc"] < 1.0 and wrong["logp"] < right["logp"]
    truncated = _Oracle(ids[:-1], len(tiny_tokenizer))  # knows all but the last answer token
    partial, = score_answers(truncated, tiny_tokenizer, [(prompt, answer)], 4, "cpu")
    assert not partial["strict"] and 0 < partial["token_acc"] < 1


def test_alignment_spearman_perfect_and_reversed():
    torch.manual_seed(0)
    keys = torch.randn(20, 6)
    assert alignment_spearman(keys, keys * 3) == 1.0
    assert alignment_spearman(keys, torch.randn(20, 6)) < 0.5
