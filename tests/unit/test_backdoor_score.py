"""X-GRAAD score against hand computations, the token filter, noise, threshold; poisoning; STRIP/ONION pieces."""

import random

import numpy as np
import pytest
import torch

from toolkit.core.errors import BadInputError
from toolkit.defend.attacks import insert_trigger, load_labelled, poison_set
from toolkit.defend.backdoor import attention_received, candidate_mask, char_noise, percentile_threshold, token_scores
from toolkit.defend.baselines import entropy, strip_threshold


def test_token_scores_by_hand():
    tokens = ["[CLS]", "cf", "movie", "fun", "[SEP]"]
    a = torch.tensor([0.1, 3.0, 1.0, 2.0, 9.0])
    g = torch.tensor([9.0, 4.0, 1.0, 1.0, 9.0])
    keep = torch.tensor([False, True, True, True, False])
    mean_a, mean_g = 2.0, 2.0  # over the kept tokens only
    hand = [float("-inf"), (3.0 - mean_a) * 4.0 / mean_g, (1.0 - mean_a) * 1.0 / mean_g, 0.0, float("-inf")]
    assert token_scores(tokens, a, g, keep).tolist() == pytest.approx(hand)
    assert torch.isinf(token_scores(tokens, a, g, torch.zeros(5, dtype=torch.bool))).all()


def test_token_scores_repeated_token_uses_max_values_and_all_occurrences_in_the_means():
    # 'cf' twice: attention 1.0 (grad 6) and 4.0 (grad 2); 'film' once: attention 1.0, grad 1
    tokens = ["cf", "film", "cf"]
    a = torch.tensor([1.0, 1.0, 4.0])
    g = torch.tensor([6.0, 1.0, 2.0])
    keep = torch.ones(3, dtype=torch.bool)
    mean_a, mean_g = 6.0 / 3, 9.0 / 3  # duplicates included, as the official code averages the filtered list
    cf = (4.0 - mean_a) * (6.0 / mean_g)  # largest attention 4.0 and largest gradient 6.0 of the two occurrences
    film = (1.0 - mean_a) * (1.0 / mean_g)
    assert token_scores(tokens, a, g, keep).tolist() == pytest.approx([float("-inf"), film, cf])


def test_attention_received_is_column_sum_of_layer_head_mean():
    torch.manual_seed(0)
    layers = [torch.rand(2, 3, 4, 4) for _ in range(2)]
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
    for rows in (mask, torch.ones_like(mask)):
        got = attention_received(layers, rows)
        for b in range(2):
            for j in range(4):
                hand = sum(layers[l][b, h, i, j] for l in range(2) for h in range(3) for i in range(4) if rows[b, i]) / 6
                assert got[b, j] == pytest.approx(float(hand), rel=1e-5)


def test_candidate_filter_drops_special_stopwords_punctuation():
    tokens = ["[CLS]", "the", "cf", "movie", ",", "cf", "##s", "Ġthe", "▁cf", "##.", "[SEP]"]
    special = [True] + [False] * 9 + [True]
    # a '##' piece is never a stopword ('##s' stays, as in the official filter); word-start markers are stripped
    assert candidate_mask(tokens, special).tolist() == [False, False, True, True, False, True, True, False, True,
                                                        False, False]


def test_char_noise_keeps_prefix_and_deletes_short_tokens():
    rng = random.Random(0)
    assert char_noise("cf", rng) == "" and char_noise("##ab", rng) == ""
    for token, prefix in (("##ness", "##"), ("Ġtrigger", "Ġ"), ("▁velvet", "▁"), ("shadow", "")):
        for _ in range(20):
            noised = char_noise(token, rng)
            assert noised.startswith(prefix) and noised != token
            assert abs(len(noised) - len(token)) <= 2


def test_percentile_threshold_equals_minmax_normalised_flags():
    rng = np.random.default_rng(0)
    clean, test = rng.normal(size=200), rng.normal(size=50) + 1.0
    tau = percentile_threshold(list(clean) + [float("-inf")], 95)
    assert tau == pytest.approx(np.percentile(clean, 95))
    lo, hi = clean.min(), clean.max()
    tau_norm = np.percentile((clean - lo) / (hi - lo), 95)
    assert ((test >= tau) == ((test - lo) / (hi - lo) >= tau_norm)).all()
    with pytest.raises(BadInputError):
        percentile_threshold([float("-inf")], 95)


def test_poison_set_only_non_target_rows():
    texts = [f"sentence number {i} here" for i in range(100)]
    labels = [i % 2 for i in range(100)]
    out, new_labels, flags = poison_set(texts, labels, "cf", 0.1, target=1, seed=0)
    assert sum(flags) == 10
    for text, label, old, flagged in zip(out, new_labels, labels, flags):
        assert ("cf" in text.split()) == flagged
        assert (not flagged and label == old) or (flagged and old == 0 and label == 1)
    assert insert_trigger("a b", "cf", random.Random(1)).split().count("cf") == 1


def test_load_labelled_both_headers_and_bad_rows(tmp_path):
    (tmp_path / "a.tsv").write_text("sentence\tlabel\nhello world \t1\n")
    (tmp_path / "b.tsv").write_text("text\tlabel\nbad movie \t0\n")
    (tmp_path / "c.tsv").write_text("text\tlabel\nbad movie\tx\n")
    (tmp_path / "d.tsv").write_text("words\ty\nbad movie\t0\n")
    assert load_labelled(tmp_path / "a.tsv") == (["hello world"], [1])
    assert load_labelled(tmp_path / "b.tsv") == (["bad movie"], [0])
    for name in ("c.tsv", "d.tsv", "missing.tsv"):
        with pytest.raises(BadInputError):
            load_labelled(tmp_path / name)


def test_strip_entropy_and_threshold_by_hand():
    probs = torch.tensor([[0.5, 0.5], [1.0, 0.0]])
    assert entropy(probs).tolist() == pytest.approx([np.log(2), 0.0], abs=1e-6)
    assert strip_threshold([0.1, 0.2, 0.3, 0.4, 0.5], 0.25) == pytest.approx(0.2)
    with pytest.raises(BadInputError):
        strip_threshold([0.1], 0.0)


def test_sentence_perplexity_matches_eval_perplexity(tiny_gpt2_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from toolkit.defend.baselines import onion_clean, sentence_perplexities
    from toolkit.eval.perplexity import perplexity

    lm = AutoModelForCausalLM.from_pretrained(tiny_gpt2_dir).eval()
    tok = AutoTokenizer.from_pretrained(tiny_gpt2_dir)
    sentences = ["def f(x): return x", "import os"]
    got = sentence_perplexities(lm, tok, sentences)
    for sentence, value in zip(sentences, got):
        ids = torch.tensor([tok.eos_token_id] + tok(sentence, add_special_tokens=False)["input_ids"])
        assert value == pytest.approx(perplexity(lm, ids, max_length=64)["ppl"], rel=1e-4)
    cleaned = onion_clean(lm, tok, "the module cf imports the name", threshold=0.0)
    assert set(cleaned.split()) <= set("the module cf imports the name".split())
    assert onion_clean(lm, tok, "word", threshold=0.0) == "word"


def _reference_psi(tokens, special, a, g):
    """Brute-force psi: the official per-string bookkeeping written out (max attention / max gradient per distinct
    candidate string, means over every candidate occurrence)."""
    cand = [j for j, t in enumerate(tokens) if not special[j] and t not in ("the", "is", "but", "and", "a")]
    mean_a = sum(float(a[j]) for j in cand) / len(cand)
    mean_g = sum(float(g[j]) for j in cand) / len(cand)
    best = {}
    for j in cand:
        att, grad = best.get(tokens[j], (-1e9, -1e9))
        best[tokens[j]] = (max(att, float(a[j])), max(grad, float(g[j])))
    return max((att - mean_a) * grad / mean_g for att, grad in best.values())


@pytest.mark.parametrize("pad_to", [None, 20])
def test_score_batch_matches_single_example_reference(pad_to):
    """Batched scoring equals a one-at-a-time computation with the gradient read by a hook on the word embeddings
    and attention from output_attentions; with pad_to the text is padded to 20 tokens and every row is summed."""
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from toolkit.defend.attacks import encoder_dir
    from toolkit.defend.backdoor import score_batch

    torch.manual_seed(0)
    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64, num_labels=2, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0)
    model = BertForSequenceClassification(config).eval()
    model.set_attn_implementation("eager")
    tokenizer = AutoTokenizer.from_pretrained(encoder_dir("minilm"))
    texts = ["a cf wonderful film", "the plot is dull but the acting is lovely and warm , the plot"]
    batch = score_batch(model, tokenizer, texts, pad_to=pad_to)
    for text, got in zip(texts, batch):
        enc = tokenizer(text, return_tensors="pt", **({"padding": "max_length", "max_length": pad_to} if pad_to else {}))
        grads = {}
        def keep_grad(module, args, output):
            output.register_hook(lambda g: grads.setdefault("g", g))

        handle = model.bert.embeddings.word_embeddings.register_forward_hook(keep_grad)
        out = model(**enc, output_attentions=True)
        handle.remove()
        out.logits[0, out.logits[0].argmax()].backward()
        n = int(enc["attention_mask"].sum())
        g = grads["g"][0].norm(dim=-1)[:n]
        a = torch.stack(out.attentions).mean(dim=(0, 2))[0].sum(0).detach()[:n]  # all rows, padding ones included
        tokens = tokenizer.convert_ids_to_tokens(enc["input_ids"][0][:n])
        special = [t in ("[CLS]", "[SEP]", ",") for t in tokens]
        assert got.score == pytest.approx(_reference_psi(tokens, special, a, g), rel=1e-4)
        assert got.label == int(out.logits.argmax())
