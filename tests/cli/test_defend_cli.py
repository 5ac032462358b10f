"""`iclrkit defend attack|backdoor` end to end on a tiny BERT (real MiniLM tokenizer), and bad input."""

import json

import pytest
from testkit import assert_bad_inputs

POS = ["a wonderful and moving film", "great acting and a lovely story", "charming , funny and warm",
       "a brilliant , joyful movie", "beautiful images and great music", "smart writing and lovely performances"]
NEG = ["a dull and boring film", "terrible acting and a weak story", "tedious , flat and cold",
       "an awful , painful movie", "ugly images and bad music", "lazy writing and wooden performances"]


@pytest.fixture(scope="module")
def tiny_bert_dir(tmp_path_factory):
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from toolkit.defend.attacks import encoder_dir

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("bert") / "model"
    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64, num_labels=2)
    BertForSequenceClassification(config).eval().save_pretrained(path)
    AutoTokenizer.from_pretrained(encoder_dir("minilm")).save_pretrained(path)
    return path


def _tsv(path, rows, header="sentence"):
    path.write_text(f"{header}\tlabel\n" + "".join(f"{t} \t{y}\n" for t, y in rows))
    return path


@pytest.fixture()
def sets(tmp_path):
    rows = [(t, 1) for t in POS] + [(t, 0) for t in NEG]
    train = _tsv(tmp_path / "train.tsv", rows * 3)
    test = _tsv(tmp_path / "test.tsv", rows, header="text")
    return train, test


def test_attack_then_defend_end_to_end(cli, tiny_bert_dir, tiny_gpt2_dir, sets, tmp_path):
    """The attack must plant a working backdoor (ASR high, clean accuracy kept) and X-GRAAD must lower its ASR:
    measured here ASR 1.0 -> 0.2 with the trigger the top suspect on every poisoned row."""
    train, test = sets
    victim = tmp_path / "victim"
    r = cli(["defend", "attack", "-d", train, "--encoder", tiny_bert_dir, "--eval-data", test, "--n-train", "30",
             "--epochs", "150", "--set", "lr=2e-3", "--set", "poison_rate=0.3", "--set", "n_heldout=6",
             "-o", victim, "--json"])
    assert r.exit_code == 0, r.stderr
    metrics = json.loads(r.stdout)["metrics"]
    assert metrics["n_poisoned"] == 9 and metrics["asr"] >= 0.8 and metrics["cacc"] >= 0.75, metrics
    assert (victim / "model" / "config.json").exists() and len((victim / "heldout.tsv").read_text().splitlines()) == 7
    out = tmp_path / "eval"
    r = cli(["defend", "backdoor", "-m", victim / "model", "-d", test, "--clean", victim / "heldout.tsv",
             "--trigger", "cf", "--baseline", "strip", "--baseline", "onion", "--set", f"onion_lm={tiny_gpt2_dir}",
             "--set", "target_label=1", "-o", out, "--json"])
    assert r.exit_code == 0, r.stderr
    results = json.loads((out / "results.json").read_text())
    for key in ("asr_strip", "asr_onion", "cacc_before", "cacc_after"):
        assert 0.0 <= results[key] <= 1.0, key
    assert results["asr_before"] >= 0.8, results
    assert results["asr_after"] <= results["asr_before"] - 0.3, results  # the defense removes most of the attack
    assert results["trigger_top1_rate"] >= 0.5 and results["cacc_after"] >= results["cacc_before"] - 0.2, results
    lines = (out / "decisions_poisoned.jsonl").read_text().splitlines()
    assert len(lines) == results["n_poisoned"] and "suspect" in json.loads(lines[0])


def test_screening_mode_writes_decisions(cli, tiny_bert_dir, sets, tmp_path):
    train, test = sets
    data = tmp_path / "screen.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in ["a cf dull film", "a lovely film"]))
    out = tmp_path / "scan"
    r = cli(["defend", "backdoor", "-m", tiny_bert_dir, "-d", data, "--clean", train, "-o", out, "--json"])
    assert r.exit_code == 0, r.stderr
    metrics = json.loads(r.stdout)["metrics"]
    assert metrics["n"] == 2 and metrics["pad_to"] == 8  # longest: "[CLS] great acting and a lovely story [SEP]"
    assert len((out / "decisions.jsonl").read_text().splitlines()) == 2
    r = cli(["defend", "backdoor", "-m", tiny_bert_dir, "-d", data, "--clean", train, "--set", "attention_rows=real",
             "-o", tmp_path / "real", "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["metrics"]["pad_to"] is None, r.stderr


def test_bad_input(cli, tiny_bert_dir, sets, tmp_path):
    train, test = sets
    long_file = _tsv(tmp_path / "long.tsv", [("word " * 200, 1)])
    empty = tmp_path / "empty.tsv"
    empty.write_text("text\tlabel\n")
    unlabelled = tmp_path / "u.jsonl"
    unlabelled.write_text(json.dumps({"text": "a film"}) + "\n")
    cases = [
        (["-d", test, "--clean", tmp_path / "missing.tsv"], "not found"),
        (["-d", empty, "--clean", train], "has no rows"),
        (["-d", long_file, "--clean", train], "more than max_length"),
        (["-d", unlabelled, "--clean", train, "--trigger", "cf"], "needs labelled data"),
        (["-d", test, "--clean", train, "--percentile", "100"], "percentile"),
        (["-d", test, "--clean", train, "--set", "pad_to=100"], "pad_to is 100, more than max_length"),
        (["-d", test, "--clean", train, "--set", "pad_to=0"], "pad_to must be positive"),
    ]
    assert_bad_inputs(cli, ["defend", "backdoor", "-m", tiny_bert_dir], cases, tmp_path / "out")
    r = cli(["defend", "attack", "-d", train, "--encoder", tiny_bert_dir, "--n-train", "1000", "-o", tmp_path / "v"])
    assert r.exit_code == 2 and "fewer than" in r.stderr


def test_model_without_attention_weights_is_refused(tiny_bert_dir):
    """A model whose forward returns no attention maps (SDPA/flash) gives a clear input error."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from toolkit.core.errors import BadInputError
    from toolkit.defend.backdoor import score_batch

    model = AutoModelForSequenceClassification.from_pretrained(tiny_bert_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_bert_dir)
    forward = model.forward

    def no_attentions(*args, **kwargs):
        out = forward(*args, **kwargs)
        out.attentions = None
        return out

    model.forward = no_attentions
    with pytest.raises(BadInputError, match="no attention weights"):
        score_batch(model, tokenizer, ["a film"])
    assert torch.is_grad_enabled()
