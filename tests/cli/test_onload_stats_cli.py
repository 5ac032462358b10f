"""`--set onload=true` on `edit` (the covariance pass), `steer pcms|ums|ilcs` and `remove-ln analyze`: the same
results as the resident commands from a sharded safetensors checkpoint; --dry-run plans the block-by-block pass and
says which steps need the whole model; a source that is not safetensors is one line, exit 2."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

pytestmark = pytest.mark.usefixtures("one_thread")

FAST = ["--set", "cov_tokens=512", "--set", "cov_seqlen=32", "--set", "context_prefixes=1", "--set",
        "prefix_tokens=3", "--set", "fluency_samples=1", "--set", "fluency_tokens=5", "--steps", "4",
        "--layers", "0,1"]
PAIRS = [("the error raised an exception and the program crashed", "the function returned a value and printed it"),
         ("an exception was raised because the file failed", "a value was returned because the file existed"),
         ("raise an error when the argument is wrong", "return a result when the argument is right")]


@pytest.fixture()
def facts(tmp_path):
    path = tmp_path / "facts.jsonl"
    rows = [{"prompt": "The value of {} is", "subject": "object", "target_new": "return"},
            {"prompt": "A list is made of", "subject": "list", "target_new": "strings"}]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return path


@pytest.fixture()
def not_safetensors(sharded_llama):
    """A model directory whose weights are a pytorch_model.bin."""
    single = sharded_llama.parent / "single"
    single.mkdir()
    (single / "config.json").write_text((sharded_llama / "config.json").read_text())
    torch.save({}, single / "pytorch_model.bin")
    return single


def _model_file(out):
    files = sorted((out / "model").glob("*.safetensors"))
    tensors = {}
    for path in files:
        tensors.update(load_file(path))
    return tensors


def test_edit_with_onloaded_covariance_equals_resident(cli, sharded_llama, facts, tmp_path):
    runs = {}
    for onload in ("false", "true"):
        out = tmp_path / onload
        r = cli(["edit", "memit", "-m", sharded_llama, "-d", facts, "-o", out, *FAST, "--set", f"onload={onload}",
                 "--set", f"stats_dir={tmp_path / ('stats-' + onload)}", "--json"])
        assert r.exit_code == 0, r.stderr
        runs[onload] = json.loads(r.stdout)["metrics"], _model_file(out)
    assert runs["true"][0]["covariance_onloaded"] is True and runs["false"][0]["covariance_onloaded"] is False
    # the same covariance files (the fingerprint read from the shards is the resident model's), the same edit
    assert sorted(p.name for p in (tmp_path / "stats-true").iterdir()) == \
        sorted(p.name for p in (tmp_path / "stats-false").iterdir())
    want, got = runs["false"][1], runs["true"][1]
    assert want.keys() == got.keys() and all(torch.allclose(want[k], got[k], atol=1e-6) for k in want)
    for key in ("efficacy", "value_nll", "insertion_reach"):
        assert runs["true"][0][key] == pytest.approx(runs["false"][0][key], abs=1e-5), key


def test_edit_dry_run_plans_the_covariance_and_says_the_edit_needs_the_whole_model(cli, sharded_llama, facts,
                                                                                  not_safetensors, tmp_path):
    plans = {}
    for onload in ("false", "true"):
        r = cli(["edit", "memit", "-m", sharded_llama, "-d", facts, *FAST, "--set", f"onload={onload}", "--dry-run"])
        assert r.exit_code == 0, r.stderr
        plans[onload] = json.loads(r.stdout)["plan"]["memory"]
    covariance, edit = plans["true"]["covariance"], plans["true"]["edit"]
    assert covariance["onload"] is True and covariance["blocks"] == 3 and covariance["blocks_read"] == 2
    assert {"non_block_weights", "block_weights", "hidden_states", "statistics"} <= set(covariance["mb"])
    assert plans["false"]["covariance"]["onload"] is False and "weights" in plans["false"]["covariance"]["mb"]
    assert edit["whole_model"] is True and edit["onload"].startswith("not available")
    assert "whole model" in edit["onload"] and edit["parameters"] > 0
    for extra in (["-o", tmp_path / "no"], ["--dry-run"]):
        r = cli(["edit", "memit", "-m", not_safetensors, "-d", facts, "--set", "onload=true", *extra])
        assert r.exit_code == 2 and "safetensors" in r.stderr and len(r.stderr.strip().splitlines()) <= 2
        assert not (tmp_path / "no").exists()


def test_steer_estimate_onloaded_equals_resident(cli, sharded_llama, tmp_path, not_safetensors):
    from toolkit.steer.intervene import load_directions

    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"undesired": u, "neutral": n}) + "\n" for u, n in PAIRS))
    found = {}
    for onload in ("false", "true"):
        out = tmp_path / f"dirs-{onload}"
        r = cli(["steer", "pcms", "-m", sharded_llama, "-d", pairs, "--layer", "1", "--set", f"onload={onload}",
                 "-o", out, "--json"])
        assert r.exit_code == 0, r.stderr
        found[onload] = load_directions(out / "directions.safetensors")
    (want, want_meta), (got, got_meta) = found["false"], found["true"]
    assert got_meta["model_fingerprint"] == want_meta["model_fingerprint"]
    assert torch.allclose(got[1], want[1], rtol=1e-5, atol=1e-5 * float(want[1].abs().max()))

    plan = cli(["steer", "pcms", "-m", sharded_llama, "-d", pairs, "--set", "onload=true", "--dry-run"])
    assert plan.exit_code == 0, plan.stderr
    memory = json.loads(plan.stdout)["plan"]["memory"]
    assert memory["onload"] is True and memory["blocks_read"] == 2  # the middle block of 3 and the ones before it
    generate = cli(["steer", "generate", "-m", sharded_llama, "--direction", "x.safetensors", "--dry-run"])
    assert generate.exit_code == 0, generate.stderr
    memory = json.loads(generate.stdout)["plan"]["memory"]
    assert memory["whole_model"] is True and "generation" in memory["onload"]
    r = cli(["steer", "pcms", "-m", not_safetensors, "-d", pairs, "--set", "onload=true", "-o", tmp_path / "no"])
    assert r.exit_code == 2 and "safetensors" in r.stderr


def test_remove_ln_analyze_onloaded_equals_resident(cli, tiny_gpt2_dir, text_file, tmp_path, not_safetensors):
    args = ["remove-ln", "analyze", "-m", tiny_gpt2_dir, "-d", text_file, "--reference", tiny_gpt2_dir, "--seqlen",
            "32", "--windows", "3", "--set", "eval_windows=5", "--json"]
    resident, onloaded = cli(args), cli([*args, "--set", "onload=true"])
    assert resident.exit_code == 0 and onloaded.exit_code == 0, onloaded.stderr
    want, got = json.loads(resident.stdout), json.loads(onloaded.stdout)
    assert got["metrics"]["onload"] is True
    for key in ("ce", "dla_scale", "dla_max_abs_err", "max_abs_logit"):
        assert got["metrics"][key] == pytest.approx(want["metrics"][key], rel=1e-5), key
    assert got["baselines"]["ce"] == pytest.approx(want["baselines"]["ce"], rel=1e-5)
    assert list(got["metrics"]["top_components"]) == list(want["metrics"]["top_components"])

    plan = cli([*args, "--set", "onload=true", "--dry-run"])
    assert plan.exit_code == 0, plan.stderr
    memory = json.loads(plan.stdout)["plan"]["memory"]
    assert memory["onload"] is True and memory["blocks_read"] == 2 and "hidden_states" in memory["mb"]
    folded = tmp_path / "folded"
    folded.mkdir()
    (folded / "config.json").write_text((tiny_gpt2_dir / "config.json").read_text())
    save_file({}, str(folded / "ln_free_folded.safetensors"))  # a valid, empty file: refused as a folded export
    for model in (folded, not_safetensors):
        r = cli(["remove-ln", "analyze", "-m", model, "-d", text_file, "--set", "onload=true"])
        assert r.exit_code == 2 and ("folded export" in r.stderr if model == folded else "safetensors" in r.stderr)
