import json
import os
import subprocess
import sys
import time

import pytest

REQUIRED_RUN_KEYS = {"schema_version", "iclrkit_version", "git_sha", "command", "technique", "config", "seed",
                     "device", "dtype", "env", "inputs", "metrics", "baselines", "artifacts", "started_at",
                     "duration_s", "status"}


def test_help_is_fast_and_imports_no_torch():
    code = ("import sys, time; t = time.perf_counter(); from cli.main import app; "
            "from typer.testing import CliRunner; r = CliRunner().invoke(app, ['--help']); "
            "assert r.exit_code == 0, r.output; "
            "print(sorted(m for m in ('torch', 'transformers', 'numpy') if m in sys.modules)); "
            "print(time.perf_counter() - t)")
    started = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    wall = time.perf_counter() - started
    heavy, _ = out.stdout.splitlines()
    assert heavy == "[]"
    assert wall < 1.5, f"iclrkit --help took {wall:.2f}s"


def test_version_and_info(cli):
    assert cli(["--version"]).stdout.startswith("iclrkit ")
    result = cli(["info", "--json"])
    data = json.loads(result.stdout)
    assert result.exit_code == 0 and data["torch"] and "fwht" in data["kernels"]["ops"]


def test_zoo_build_list_and_eval_ppl_end_to_end(cli, tmp_path, text_file):
    built = cli(["-q", "zoo", "build", "gpt2-tiny", "--json"])
    assert built.exit_code == 0, built.stderr
    assert json.loads(built.stdout)["model"] == "zoo:gpt2-tiny"
    listing = json.loads(cli(["zoo", "list", "--json"]).stdout)
    assert next(r for r in listing if r["name"] == "gpt2-tiny")["cached"]
    out = tmp_path / "ppl"
    result = cli(["eval", "ppl", "--model", "zoo:gpt2-tiny", "--data", text_file, "--max-length", "64",
                  "--max-windows", "4", "--out", out, "--json"])
    assert result.exit_code == 0, result.stderr
    record = json.loads(result.stdout)
    assert REQUIRED_RUN_KEYS <= set(record) and record["status"] == "ok" and record["metrics"]["ppl"] > 1
    assert json.loads((out / "run.json").read_text())["metrics"] == record["metrics"]
    assert (out / "config.resolved.yaml").exists() and record["inputs"]["data"]["sha256"]


def test_dry_run_writes_nothing(cli, tmp_path, tiny_gpt2_dir):
    out = tmp_path / "never"
    result = cli(["eval", "ppl", "--model", tiny_gpt2_dir, "--data", "embedded", "--out", out, "--dry-run"])
    assert result.exit_code == 0 and json.loads(result.stdout)["config"]["model"] == str(tiny_gpt2_dir)
    assert not out.exists()


@pytest.mark.parametrize("args,code,message", [
    (["--model", "/no/such/model"], 2, "model path not found"),
    (["--model", "zoo:nonexistent"], 2, "unknown zoo model"),
    (["--set", "bogus=1"], 2, "unknown config key 'bogus'"),
    (["--data", "/no/such/file.txt"], 2, "data file not found"),
])
def test_bad_input_is_one_line_and_exit_code(cli, tiny_gpt2_dir, args, code, message):
    base = ["eval", "ppl", "--model", str(tiny_gpt2_dir), "--data", "embedded"]
    result = cli(base + args)
    assert result.exit_code == code
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_bad_yaml_empty_data_cuda_and_out_rules(cli, tmp_path, tiny_gpt2_dir):
    base = ["eval", "ppl", "--model", tiny_gpt2_dir]
    bad_yaml = tmp_path / "c.yaml"
    bad_yaml.write_text("max_length: [1,\n")
    assert cli(base + ["--config", bad_yaml]).exit_code == 2
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    result = cli(base + ["--data", empty])
    assert result.exit_code == 2 and "empty" in result.stderr
    import torch

    if not torch.cuda.is_available():
        assert cli(base + ["--device", "cuda"]).exit_code == 3
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "keep.txt").write_text("precious")
    result = cli(base + ["--data", "embedded", "--out", taken, "--max-windows", "1"])
    assert result.exit_code == 2 and "--overwrite" in result.stderr
    assert (taken / "keep.txt").read_text() == "precious"
    inside = cli(base + ["--data", "embedded", "--out", tiny_gpt2_dir / "sub", "--max-windows", "1"])
    assert inside.exit_code == 2 and "inside the input" in inside.stderr
    assert not (tiny_gpt2_dir / "sub").exists()


def test_offline_uncached_hub_id_exits_3(cli, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    result = cli(["--offline", "eval", "ppl", "--model", "some-org/not-cached-anywhere", "--data", "embedded"])
    assert result.exit_code == 3 and "not cached" in result.stderr


def test_console_script_runs(tmp_path):
    exe = os.path.join(os.path.dirname(sys.executable), "iclrkit")
    if not os.path.exists(exe):
        pytest.skip("console script not installed")
    result = subprocess.run([exe, "--version"], capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.startswith("iclrkit")


def test_every_present_command_family_imports():
    from cli.main import BROKEN_FAMILIES

    assert BROKEN_FAMILIES == {}


def test_non_zero_rank_runs_but_writes_nothing_at_out(cli, tmp_path, tiny_gpt2_dir, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    out = tmp_path / "rank1"
    result = cli(["eval", "ppl", "--model", tiny_gpt2_dir, "--data", "embedded", "--max-windows", "1",
                  "--max-length", "32", "--out", out])
    assert result.exit_code == 0, result.stderr
    assert not out.exists() and result.stdout == ""


def test_common_of_maps_command_parameters():
    from cli._runner import Common

    common = Common.of({"out": "o", "set_": ["a=1"], "json_": True, "device": "cuda", "unrelated": 1}, device="cpu")
    assert (common.out, common.set, common.json, common.device, common.dtype) == ("o", ["a=1"], True, "cpu", None)
