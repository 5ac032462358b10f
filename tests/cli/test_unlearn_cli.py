"""`iclrkit unlearn prism|npo|ga|rmu|eval|relearn` end to end on a tiny GPT-2, and bad input -> exit 2."""

import json

import pytest
import torch

pytestmark = pytest.mark.usefixtures("one_thread")

FAST = ["--max-length", "24", "--epochs", "1", "--batch-size", "2", "--lr", "1e-3"]


@pytest.fixture()
def data(tmp_path, text_file):
    text = text_file.read_text()
    docs = [text[i:i + 300] for i in range(0, 3000, 300)]
    paths = {"forget": tmp_path / "forget.json", "retain": tmp_path / "retain.jsonl", "holdout": tmp_path / "h.json",
             "verbmem": tmp_path / "verbmem.json", "qa": tmp_path / "qa.json"}
    paths["forget"].write_text(json.dumps(docs[:4]))
    paths["retain"].write_text("\n".join(json.dumps({"text": d}) for d in docs[4:8]))
    paths["holdout"].write_text(json.dumps(docs[8:]))
    paths["verbmem"].write_text(json.dumps([{"prompt": d[:80], "gt": d[80:160]} for d in docs[:2]]))
    paths["qa"].write_text(json.dumps([{"question": "What is a list?", "answer": "a sequence"}]))
    return paths


def _train(cli, method, model, data, out, *extra):
    return cli(["unlearn", method, "-m", model, "-f", data["forget"], "-r", data["retain"], "-o", out, *FAST, *extra])


def test_prism_end_to_end_saves_a_loadable_model(cli, tmp_path, data, tiny_gpt2_dir, device_args):
    from transformers import AutoModelForCausalLM

    out = tmp_path / "prism"
    result = _train(cli, "prism", tiny_gpt2_dir, data, out, "--probe-layer", "1", "--set", "probe_epochs=2",
                    *device_args)
    assert result.exit_code == 0, result.stderr
    record = json.loads((out / "run.json").read_text())
    assert record["technique"] == "unlearn.prism" and record["status"] == "ok"
    metrics = record["metrics"]
    assert metrics["probe_layer"] == 1 and metrics["final_gamma"] > 0 and metrics["steps"] >= 1
    assert (out / "probe.pt").exists() and not (out / "checkpoints").exists()
    changed = AutoModelForCausalLM.from_pretrained(out / "model").state_dict()
    original = AutoModelForCausalLM.from_pretrained(tiny_gpt2_dir).state_dict()
    assert any(not torch.equal(changed[k], original[k]) for k in original)


@pytest.mark.parametrize("method, extra", [("npo", []), ("ga", []), ("rmu", ["--layer", "1"])])
def test_baselines_end_to_end(cli, tmp_path, data, tiny_gpt2_dir, method, extra):
    out = tmp_path / method
    result = _train(cli, method, tiny_gpt2_dir, data, out, *extra)
    assert result.exit_code == 0, result.stderr
    record = json.loads((out / "run.json").read_text())
    assert record["technique"] == f"unlearn.{method}" and (out / "model" / "config.json").exists()


def test_eval_and_relearn(cli, tmp_path, data, tiny_gpt2_dir):
    common = ["-m", tiny_gpt2_dir, "--verbmem", data["verbmem"], "--forget-qa", data["qa"], "--retain-qa",
              data["qa"], "--holdout", data["holdout"], "-r", data["retain"], "--reference-model", tiny_gpt2_dir,
              "--set", "verbmem_new_tokens=8", "--set", "qa_new_tokens=4", "--set", "embed_steps=2",
              "--set", "max_length=32"]
    result = cli(["unlearn", "eval", *common, "--json"])
    assert result.exit_code == 0, result.stderr
    metrics = json.loads(result.stdout)["metrics"]
    for key in ("verbmem_forget", "knowmem_forget", "knowmem_retain", "mia_auc", "privleak", "utility_ppl",
                "verbmem_jailbreak_prefix", "verbmem_embed_attack"):
        assert key in metrics
    assert metrics["privleak"] == pytest.approx(0.0)  # the reference is the same model
    out = tmp_path / "relearn"
    result = cli(["unlearn", "relearn", *common, "-f", data["forget"], "--steps", "2", "--set", "train_length=24",
                  "--set", "jailbreak=false", "-o", out])
    assert result.exit_code == 0, result.stderr
    metrics = json.loads((out / "run.json").read_text())["metrics"]
    assert "before" in metrics and "relearn_last_loss" in metrics and (out / "model" / "config.json").exists()


def test_dry_run_prints_the_plan(cli, tmp_path, data, tiny_gpt2_dir):
    result = _train(cli, "prism", tiny_gpt2_dir, data, tmp_path / "dry", "--dry-run")
    assert result.exit_code == 0 and json.loads(result.stdout)["plan"]["stages"]
    assert not (tmp_path / "dry").exists()


@pytest.mark.parametrize("case, message", [
    ("missing", "not found"), ("malformed", "malformed JSON"), ("empty", "no records"),
    ("no_retain", "needs retain"), ("bad_lr", "lr"), ("nan_rho", "sam_rho"), ("bad_layer", "layer"),
    ("no_forget", "'forget': Field required"),
])
def test_bad_input_exits_2(cli, tmp_path, data, tiny_gpt2_dir, case, message):
    broken = tmp_path / "broken.json"
    args = ["unlearn", "prism", "-m", tiny_gpt2_dir, "-f", data["forget"], "-r", data["retain"], "-o",
            tmp_path / "out", *FAST]
    if case == "missing":
        args[args.index("-f") + 1] = tmp_path / "nope.json"
    elif case == "malformed":
        broken.write_text("[{")
        args[args.index("-f") + 1] = broken
    elif case == "empty":
        broken.write_text("[]")
        args[args.index("-r") + 1] = broken
    elif case == "no_retain":
        del args[args.index("-r"):args.index("-r") + 2]
    elif case == "no_forget":  # required by the config (a --config YAML or --set may give it instead)
        del args[args.index("-f"):args.index("-f") + 2]
    elif case == "bad_lr":
        args[args.index("--lr") + 1] = "-1"
    elif case == "nan_rho":
        args += ["--sam-rho", "nan"]
    else:
        args += ["--probe-layer", "9"]
    result = cli(args)
    assert result.exit_code == 2, result.stderr
    assert message in result.stderr and not (tmp_path / "out").exists()


def test_eval_rejects_records_without_gt(cli, tmp_path, tiny_gpt2_dir):
    bad = tmp_path / "v.json"
    bad.write_text(json.dumps([{"prompt": "x"}]))
    result = cli(["unlearn", "eval", "-m", tiny_gpt2_dir, "--verbmem", bad])
    assert result.exit_code == 2 and "'gt'" in result.stderr
