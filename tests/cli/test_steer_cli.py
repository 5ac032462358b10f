"""`iclrkit steer` end to end on a tiny Llama: estimate -> generate -> sweep, and bad input."""

import json

import pytest
from testkit import assert_bad_inputs

PAIRS = [("the error raised an exception and the program crashed", "the function returned a value and printed it"),
         ("an exception was raised because the file failed", "a value was returned because the file existed"),
         ("the import failed with an error in the module", "the import worked with a name in the module"),
         ("raise an error when the argument is wrong", "return a result when the argument is right")]


@pytest.fixture()
def pairs_file(tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps({"undesired": u, "neutral": n}) + "\n" for u, n in PAIRS)
                    + json.dumps({"neutral": "a class defines methods and attributes"}) + "\n")
    return path


@pytest.fixture()
def prompts_file(tmp_path):
    path = tmp_path / "prompts.jsonl"
    rows = [{"prompt": "the error", "kind": "category"}, {"prompt": "raise an", "kind": "category"},
            {"prompt": "the function", "kind": "neutral"}, {"prompt": "a class", "kind": "neutral"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def tiny_encoder_dir(tmp_path_factory):
    """A tiny random BERT with the real MiniLM tokenizer, standing in for the judge encoder."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    from toolkit.defend.attacks import encoder_dir

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("enc") / "bert"
    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=128)
    BertModel(config).save_pretrained(path)
    AutoTokenizer.from_pretrained(encoder_dir("minilm")).save_pretrained(path)
    return path


@pytest.mark.parametrize("method", ["pcms", "ums", "ilcs"])
def test_estimate_writes_directions(cli, tiny_llama_dir, pairs_file, tmp_path, method):
    out = tmp_path / "dirs"
    r = cli(["steer", method, "-m", tiny_llama_dir, "-d", pairs_file, "--layer", "1", "-o", out, "--json"])
    assert r.exit_code == 0, r.stderr
    record = json.loads(r.stdout)
    assert record["metrics"]["n_pairs"] == 4
    assert record["metrics"]["n_neutral"] == (5 if method == "ums" else 4)
    assert "split_half_cosine" in record["metrics"]["layers"]["1"]
    from toolkit.steer.intervene import load_directions

    directions, meta = load_directions(out / "directions.safetensors")
    assert list(directions) == [1] and meta["method"] == method and len(meta["model_fingerprint"]) == 16


def test_generate_and_sweep(cli, tiny_llama_dir, tiny_gpt2_dir, pairs_file, prompts_file, tiny_encoder_dir, tmp_path):
    dirs = tmp_path / "dirs"
    assert cli(["steer", "pcms", "-m", tiny_llama_dir, "-d", pairs_file, "--layer", "0", "-o", dirs]).exit_code == 0
    gen = tmp_path / "gen"
    r = cli(["steer", "generate", "-m", tiny_llama_dir, "--direction", dirs / "directions.safetensors",
             "--prompt", "the error", "--alpha", "50", "--max-new-tokens", "4", "-o", gen])
    assert r.exit_code == 0, r.stderr
    row = json.loads((gen / "generations.jsonl").read_text().splitlines()[0])
    assert set(row) == {"prompt", "steered", "unsteered"}
    # a direction made on another model is refused
    r = cli(["steer", "generate", "-m", tiny_gpt2_dir, "--direction", dirs / "directions.safetensors",
             "--prompt", "x", "-o", tmp_path / "gen2"])
    assert r.exit_code == 2 and "another model" in r.stderr
    sweep = tmp_path / "sweep"
    r = cli(["steer", "sweep", "-m", tiny_llama_dir, "-d", pairs_file, "--prompts", prompts_file, "--layer", "0",
             "--layer", "1", "--alpha", "0.5", "--alpha", "2", "--method", "pcms", "--method", "ums",
             "--set", f"judge_encoder={tiny_encoder_dir}", "--set", "lexicon=[error, exception, raise, the]",
             "--set", "max_new_tokens=3", "--set", "ppl_tokens=64", "-o", sweep])
    assert r.exit_code == 0, r.stderr
    results = json.loads((sweep / "results.json").read_text())
    assert len(results["rows"]) == 8
    assert {"method", "layer", "alpha", "category_prob_drop", "neutral_kl", "neutral_ppl_ratio",
            "split_half_cosine"} <= set(results["rows"][0])
    assert (sweep / "sweep.png").stat().st_size > 1000
    assert json.loads((sweep / "run.json").read_text())["status"] == "ok"
    # multi-layer steering with the clip operator: only the group's row, labelled "0+1"
    r = cli(["steer", "sweep", "-m", tiny_llama_dir, "-d", pairs_file, "--prompts", prompts_file, "--alpha", "1",
             "--method", "pcms", "--operator", "clip", "--set", "layers=[]", "--set", "layer_groups=[[0, 1]]",
             "--set", f"judge_encoder={tiny_encoder_dir}", "--set", "lexicon=[error, exception, raise, the]",
             "--set", "max_new_tokens=3", "--set", "ppl_tokens=64", "-o", tmp_path / "sweep2"])
    assert r.exit_code == 0, r.stderr
    rows = json.loads((tmp_path / "sweep2" / "results.json").read_text())["rows"]
    assert [(row["layer"], row["operator"]) for row in rows] == [("0+1", "clip")]
    r = cli(["steer", "sweep", "-m", tiny_llama_dir, "-d", pairs_file, "--prompts", prompts_file,
             "--set", "layer_groups=[[0, 9]]", "--set", "lexicon=[the]", "-o", tmp_path / "sweep3"])
    assert r.exit_code == 2 and "out of range" in r.stderr


def test_bad_input(cli, tiny_llama_dir, pairs_file, tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    only_neutral = tmp_path / "neutral.jsonl"
    only_neutral.write_text(json.dumps({"neutral": "a"}) + "\n")
    unpaired = tmp_path / "unpaired.jsonl"
    unpaired.write_text(json.dumps({"neutral": "a"}) + "\n" + json.dumps({"undesired": "b"}) + "\n")
    long_text = tmp_path / "long.jsonl"
    long_text.write_text(json.dumps({"undesired": "error " * 400, "neutral": "value"}) + "\n")
    cases = [
        (["-d", empty, "--layer", "0"], "no records"),
        (["-d", only_neutral, "--layer", "0"], "at least one undesired"),
        (["-d", unpaired, "--layer", "0"], "needs paired records"),
        (["-d", pairs_file, "--layer", "7"], "out of range"),
        (["-d", long_text, "--layer", "0"], "longer than the model's context"),
        (["-d", tmp_path / "missing.jsonl", "--layer", "0"], "not found"),
    ]
    assert_bad_inputs(cli, ["steer", "pcms", "-m", tiny_llama_dir], cases, tmp_path / "out")
