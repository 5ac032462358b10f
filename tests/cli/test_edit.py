"""`iclrkit edit memit|eamet` end to end on the tiny fixtures, EAMET(alignment off) == MEMIT, bad input."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

FAST = ["--set", "cov_tokens=512", "--set", "cov_seqlen=32", "--set", "context_prefixes=1", "--set",
        "prefix_tokens=3", "--set", "fluency_samples=1", "--set", "fluency_tokens=5", "--steps", "4"]


@pytest.fixture()
def facts(tmp_path):
    path = tmp_path / "facts.jsonl"
    rows = [{"prompt": "The value of {} is", "subject": "object", "target_new": "return",
             "target_true": "class", "paraphrases": ["What is object? It is"],
             "neighborhood": [{"prompt": "The value of type is", "answer": "class"}]},
            {"prompt": "A list is made of", "subject": "list", "target_new": "strings"},
            {"prompt": "Import {} from", "subject": "module", "target_new": "package"}]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return path


def _run(cli, tmp_path, model_dir, facts, name, method, *extra):
    out = tmp_path / name
    result = cli(["edit", method, "-m", model_dir, "-d", facts, "-o", out, "--set", f"stats_dir={tmp_path / 'stats'}",
                  *FAST, *extra])
    assert result.exit_code == 0, result.stderr
    return out


@pytest.mark.parametrize("fixture, method", [("tiny_gpt2_dir", "eamet"), ("tiny_llama_dir", "memit")])
def test_edit_end_to_end(cli, tmp_path, facts, fixture, method, request, device_args):
    from transformers import AutoModelForCausalLM

    model_dir = request.getfixturevalue(fixture)
    out = _run(cli, tmp_path, model_dir, facts, method, method, "--batch-size", "2", *device_args)
    record = json.loads((out / "run.json").read_text())
    assert record["status"] == "ok" and record["technique"] == f"edit.{method}"
    assert "metrics.json" not in record["artifacts"] and not (out / "metrics.json").exists()  # run.json only
    metrics = record["metrics"]
    for key in ("efficacy", "generalization", "specificity", "fluency", "alignment_spearman"):
        assert key in metrics
    assert len(metrics["batches"]) == 2 and "efficacy" in record["baselines"]["unedited"]
    edited = AutoModelForCausalLM.from_pretrained(out / "model")
    original = AutoModelForCausalLM.from_pretrained(model_dir)
    changed = [n for n, p in edited.state_dict().items() if not torch.equal(p, original.state_dict()[n])]
    assert changed and all("mlp" in n for n in changed)


def test_eamet_without_alignment_equals_memit(cli, tmp_path, tiny_gpt2_dir):
    """On an edit that changes the model: prompts that end at the subject (δ enters the last edit layer's output at
    the position that predicts the target; with the prompts above, which go on past the subject, a 2-block model's
    last edit layer is its last block and δ cannot reach the prediction: δ stays 0 and two no-op edits would compare
    equal) and λ = 1 (the tiny covariance makes the default λ's insertion reach ~1 %)."""
    facts = tmp_path / "subject-last.jsonl"
    facts.write_text("\n".join(json.dumps({"prompt": p, "subject": s, "target_new": t}) for p, s, t in [
        ("The value of {}", "object", "return"), ("A list is made of {}", "list", "strings"),
        ("Import {}", "module", "package")]))
    memit = _run(cli, tmp_path, tiny_gpt2_dir, facts, "memit", "memit", "--mom2-weight", "1")
    eamet = _run(cli, tmp_path, tiny_gpt2_dir, facts, "eamet", "eamet", "--mom2-weight", "1", "--align-kl", "0",
                 "--align-mse", "0", "--set", "init=zero", "--set", "clamp=h", "--set", "clamp_factor=0.75", "--set",
                 "v_weight_decay=0.5", "--set", "early_stop_loss=0.05")
    for out in (memit, eamet):
        delta = load_file(out / "values.safetensors")["delta"]
        assert bool((delta.norm(dim=-1) > 1e-2).all()), delta.norm(dim=-1)  # every request has a real δ
        record = json.loads((out / "run.json").read_text())
        edited, unedited = record["metrics"], record["baselines"]["unedited"]
        assert edited["efficacy_token_acc"] > unedited["efficacy_token_acc"]  # the edit moved the efficacy
        rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
        assert all(r["post"]["logp_new"] > r["pre"]["logp_new"] + 0.01 for r in rows)  # and every target's log-prob
    a, b = load_file(memit / "model" / "model.safetensors"), load_file(eamet / "model" / "model.safetensors")
    original = load_file(tiny_gpt2_dir / "model.safetensors")
    assert max(float((a[k] - original[k]).abs().max()) for k in a) > 1e-3
    assert all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)
    va, vb = load_file(memit / "values.safetensors"), load_file(eamet / "values.safetensors")
    assert torch.allclose(va["delta"], vb["delta"], atol=1e-5)


@pytest.mark.parametrize("args, message", [
    (["--layers", "0,7"], "out of range"),
    (["--layers", "a"], "comma-separated integers"),
    (["--n-edits", "10"], "fewer than"),
])
def test_bad_arguments(cli, tmp_path, facts, tiny_gpt2_dir, args, message):
    result = cli(["edit", "memit", "-m", tiny_gpt2_dir, "-d", facts, "-o", tmp_path / "o", *FAST, *args])
    assert result.exit_code == 2 and message in result.stderr
    assert not (tmp_path / "o").exists()


def test_bad_fact_files(cli, tmp_path, tiny_gpt2_dir):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "{} is", "subject": "A", "target_new": "B"}\n{"prompt": oops}\n')
    result = cli(["edit", "eamet", "-m", tiny_gpt2_dir, "-d", bad, "-o", tmp_path / "o"])
    assert result.exit_code == 2 and "bad.jsonl:2: malformed JSON" in result.stderr
    missing = cli(["edit", "eamet", "-m", tiny_gpt2_dir, "-d", tmp_path / "nope.json", "-o", tmp_path / "o"])
    assert missing.exit_code == 2 and "not found" in missing.stderr
    subject = tmp_path / "subject.jsonl"
    subject.write_text('{"prompt": "Rome is", "subject": "Paris", "target_new": "B"}\n')
    result = cli(["edit", "memit", "-m", tiny_gpt2_dir, "-d", subject, "-o", tmp_path / "o"])
    assert result.exit_code == 2 and "subject.jsonl:1" in result.stderr and "not found in prompt" in result.stderr


def test_dry_run_prints_plan(cli, tmp_path, facts, tiny_gpt2_dir):
    result = cli(["edit", "memit", "-m", tiny_gpt2_dir, "-d", facts, "--dry-run"])
    assert result.exit_code == 0 and json.loads(result.stdout)["plan"]["n_edits"] == 3


def test_reused_values_give_the_same_edit(cli, tmp_path, facts, tiny_gpt2_dir):
    first = _run(cli, tmp_path, tiny_gpt2_dir, facts, "first", "eamet")
    again = _run(cli, tmp_path, tiny_gpt2_dir, facts, "again", "eamet", "--values", first)
    a, b = load_file(first / "model" / "model.safetensors"), load_file(again / "model" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    metrics = [json.loads((out / "run.json").read_text())["metrics"] for out in (first, again)]
    for key in ("efficacy", "value_nll", "insertion_reach", "alignment_spearman"):
        assert metrics[0][key] == metrics[1][key]
    assert metrics[1]["values_from"] == str(first)
    other_lambda = _run(cli, tmp_path, tiny_gpt2_dir, facts, "lam", "eamet", "--values", first, "--mom2-weight", "50")
    c = load_file(other_lambda / "model" / "model.safetensors")
    assert any(not torch.equal(a[k], c[k]) for k in a)


def test_values_of_another_run_are_refused(cli, tmp_path, facts, tiny_gpt2_dir, tiny_llama_dir):
    first = _run(cli, tmp_path, tiny_gpt2_dir, facts, "first", "memit")
    cases = [([tiny_gpt2_dir, "-n", "2", "--values", first], "another facts"),
             ([tiny_gpt2_dir, "--layers", "1", "--values", first], "another layers"),
             ([tiny_llama_dir, "--values", first], "another"),
             ([tiny_gpt2_dir, "--batch-size", "2", "--values", first], "one batch"),
             ([tiny_gpt2_dir, "--values", tmp_path / "none"], "values file not found")]
    (tmp_path / "junk.safetensors").write_bytes(b"not a tensor file")
    cases.append(([tiny_gpt2_dir, "--values", tmp_path / "junk.safetensors"], "cannot read values file"))
    save_file({"weight": torch.zeros(2)}, str(tmp_path / "other.safetensors"))
    cases.append(([tiny_gpt2_dir, "--values", tmp_path / "other.safetensors"], "not a values file"))
    for (model, *args), message in cases:
        out = tmp_path / "refused"
        result = cli(["edit", "memit", "-m", model, "-d", facts, "-o", out, "--set",
                      f"stats_dir={tmp_path / 'stats'}", *FAST, *args])
        assert result.exit_code == 2 and message in result.stderr, (args, result.stderr)
        assert not out.exists()


TINY_HPARAMS = """alg_name: MEMIT
model_name: ./hugging_cache/not-used
layers: [0, 1]
clamp_norm_factor: 0.75
fact_token: subject_last
layer_selection: all
v_num_grad_steps: 4
v_lr: 5e-1
v_loss_layer: 47
v_weight_decay: 0.5
kl_factor: 0.0625
mom2_adjustment: true
mom2_update_weight: 15000
rewrite_module_tmp: "transformer.h.{}.mlp.c_proj"
mom2_dataset: wikipedia
"""


def test_knowedit_with_easyedit_hparams_writes_per_record_results(cli, tmp_path, tiny_gpt2_dir):
    data = tmp_path / "knowedit.json"
    data.write_text(json.dumps([
        {"subject": "object", "prompt": "The value of object is", "target_new": "return", "ground_truth": "class",
         "portability": {"Reasoning": [{"prompt": "The type of the value of object is",
                                        "ground_truth": [["return", "returns"]]}]},
         "locality": {"Relation_Specificity": [{"prompt": "The value of type is", "ground_truth": [["class"]]}]}},
        {"subject": "list", "prompt": "A list is made of", "target_new": "strings",
         "locality": {"Forgetfulness": [{"prompt": "A list holds", "ground_truth": "items"}]}}]))
    hparams = tmp_path / "gpt2.yaml"
    hparams.write_text(TINY_HPARAMS)
    out = tmp_path / "kn"
    result = cli(["edit", "memit", "-m", tiny_gpt2_dir, "-d", data, "--config", hparams, "-o", out,
                  "--set", f"stats_dir={tmp_path / 'stats'}", *FAST[:-2]])
    assert result.exit_code == 0, result.stderr
    assert "mom2_dataset" in result.stderr and "v_loss_layer" in result.stderr  # no silence about unused keys
    record = json.loads((out / "run.json").read_text())
    assert record["config"]["layers"] == [0, 1] and record["config"]["v_num_grad_steps"] == 4
    assert record["config"]["clamp_factor"] == 0.75 and "portability" in record["metrics"]
    assert "specificity" in record["metrics"]
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [r["subject"] for r in rows] == ["object", "list"]
    assert {"efficacy", "specificity", "portability"} <= set(rows[0]["pre"]) and "portability" in rows[0]["post"]
    assert "portability" not in rows[1]["post"] and "specificity" in rows[1]["post"]
    assert sum(r["post"]["efficacy"] for r in rows) / 2 * 100 == pytest.approx(record["metrics"]["efficacy"])


def test_bad_easyedit_inputs_exit_2(cli, tmp_path, facts, tiny_gpt2_dir):
    rome = tmp_path / "rome.yaml"
    rome.write_text("alg_name: ROME\nlayers: [5]\n")
    result = cli(["edit", "memit", "-m", tiny_gpt2_dir, "-d", facts, "--config", rome, "-o", tmp_path / "o"])
    assert result.exit_code == 2 and "ROME" in result.stderr and not (tmp_path / "o").exists()
    mquake = tmp_path / "mquake.json"
    mquake.write_text(json.dumps([{"case_id": 1, "requested_rewrite": [{"prompt": "{} is a citizen of",
                                   "subject": "Ellie Kemper", "target_new": {"str": "Croatia"}}],
                                   "questions": ["?"], "new_answer": "Zagreb"}]))
    result = cli(["edit", "memit", "-m", tiny_gpt2_dir, "-d", mquake, "-o", tmp_path / "o"])
    assert result.exit_code == 2 and "MQuAKE" in result.stderr and not (tmp_path / "o").exists()
