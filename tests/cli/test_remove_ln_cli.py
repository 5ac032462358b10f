"""`iclrkit remove-ln run|analyze` end to end on a tiny GPT-2, and bad input."""

from __future__ import annotations

import json

import pytest
import torch

FAST = ["--steps", "30", "--batch-size", "4", "--seqlen", "32", "--set", "eval_windows=8",
        "--set", "calibration_batches=1"]


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def removed(tmp_path_factory, tiny_gpt2_dir, device_args):
    """One full run (both exports + vanilla control) shared by the tests below."""
    from typer.testing import CliRunner

    from cli.main import app

    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("rln") / "out"
    data = tmp_path_factory.mktemp("rlndata") / "train.txt"
    from toolkit.data.text import embedded_text

    data.write_text(embedded_text()[:30_000])
    result = CliRunner().invoke(app, ["remove-ln", "run", "-m", str(tiny_gpt2_dir), "-d", str(data), *FAST,
                                      "--export", "both", "--vanilla-control", *device_args, "-o", str(out), "--json"],
                                catch_exceptions=False)
    return result, out, data


def test_run_end_to_end_writes_both_exports_and_metrics(removed):
    from transformers import GPT2LMHeadModel

    from toolkit.remove_ln.export import has_no_layernorm, load_folded

    result, out, _ = removed
    assert result.exit_code == 0, result.stderr
    record = json.loads(result.stdout)
    metrics = record["metrics"]
    for key in ("ce_original", "ce_naive_removal", "ce_ln_free", "export_max_abs_logit_diff", "train_tokens"):
        assert key in metrics
    assert metrics["export_max_abs_logit_diff"] < 1e-4
    assert "ce_vanilla_ft" in record["baselines"]
    assert len(metrics["schedule"]) == 3 * 2 + 3
    assert json.loads((out / "run.json").read_text())["status"] == "ok"
    plain = GPT2LMHeadModel.from_pretrained(out / "model")
    assert plain.config.layer_norm_epsilon == 1e12
    assert has_no_layernorm(load_folded(out / "model-folded"))
    assert not (out / "checkpoints").exists()


def test_analyze_dla_sums_on_export_not_on_original(cli, removed, tiny_gpt2_dir):
    _, out, data = removed
    r = cli(["remove-ln", "analyze", "-m", out / "model-folded", "-d", data, "--reference", tiny_gpt2_dir,
             "--seqlen", "32", "--windows", "4", "--set", "eval_windows=4", "--json"])
    assert r.exit_code == 0, r.stderr
    record = json.loads(r.stdout)
    assert record["metrics"]["dla_max_abs_err"] < 1e-4
    assert record["baselines"]["dla_max_abs_err"] > 1e-4


def test_dry_run_prints_the_schedule(cli, tiny_gpt2_dir):
    r = cli(["remove-ln", "run", "-m", tiny_gpt2_dir, *FAST, "--dry-run"])
    assert r.exit_code == 0, r.stderr
    plan = json.loads(r.stdout)["plan"]
    assert plan["schedule"]["bos"] < 30 and plan["train_tokens"] == 30 * 4 * 32


@pytest.mark.parametrize("args, message", [
    (["--steps", "10"], "too few"),
    (["--set", "lr=.nan"], "finite number"),
    (["--set", "momentum=1.5"], "momentum"),
    (["--set", "no_such_key=1"], "unknown config key"),
    (["-d", "/nonexistent/data.txt"], "not found"),
])
def test_bad_input_is_one_line_exit_2(cli, tiny_gpt2_dir, tmp_path, args, message):
    r = cli(["remove-ln", "run", "-m", tiny_gpt2_dir, *FAST, *args, "-o", tmp_path / "out"])
    assert r.exit_code == 2, r.stdout + r.stderr
    last = r.stderr.strip().splitlines()[-1]  # earlier lines are transformers' loading bar
    assert last.startswith("error:") and message in last
    assert not (tmp_path / "out").exists()


def test_llama_gets_a_clear_rmsnorm_message(cli, tiny_llama_dir, tmp_path):
    r = cli(["remove-ln", "run", "-m", tiny_llama_dir, *FAST, "-o", tmp_path / "out"])
    assert r.exit_code == 2 and "RMSNorm" in r.stderr


def test_resume_from_a_checkpoint_of_another_model_is_refused(cli, tiny_gpt2_dir, tmp_path):
    partial = tmp_path / "out.partial" / "checkpoints"
    partial.mkdir(parents=True)
    torch.save({"fingerprint": {"model": "another", "recipe": "x"}, "step": 5}, partial / "ln_free.pt")
    r = cli(["remove-ln", "run", "-m", tiny_gpt2_dir, *FAST, "-o", tmp_path / "out", "--resume"])
    assert r.exit_code == 2 and "another model" in r.stderr


def test_analyze_rejects_missing_model(cli, tmp_path):
    r = cli(["remove-ln", "analyze", "-m", tmp_path / "missing/"])
    assert r.exit_code == 2 and "not found" in r.stderr
