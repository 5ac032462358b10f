import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REQUIRED_RUN_KEYS = {"schema_version", "iclrkit_version", "git_sha", "command", "technique", "config", "seed",
                     "device", "dtype", "env", "inputs", "metrics", "baselines", "artifacts", "started_at",
                     "duration_s", "status"}


def test_help_imports_no_heavy_module():
    """`iclrkit --help` (and every family's import) stays light: no torch/transformers at import time. The
    wall-clock of --help is a benchmark figure, not a test assertion (it depends on the machine's load)."""
    code = ("import sys; from cli.main import app; "
            "from typer.testing import CliRunner; r = CliRunner().invoke(app, ['--help']); "
            "assert r.exit_code == 0, r.output; "
            "print(sorted(m for m in ('torch', 'transformers', 'scipy', 'sklearn', 'safetensors', "
            "'accelerate', 'pyscipopt') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


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


def test_single_process_command_refuses_ranks_above_zero(cli, tmp_path, tiny_gpt2_dir, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    out = tmp_path / "rank1"
    result = cli(["eval", "ppl", "--model", tiny_gpt2_dir, "--data", "embedded", "--max-windows", "1",
                  "--max-length", "32", "--out", out])
    assert result.exit_code == 2 and "eval.ppl runs in one process; rank 1 of 2 exits" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not out.exists() and result.stdout == ""


def _toy_execute(tmp_path, technique, monkeypatch, env, multi_rank=None, device="auto"):
    """execute() of a tiny technique that records the device and thread count it ran with."""
    from cli._runner import Common, execute
    from toolkit.core.config import BaseConfig

    for key, value in env.items():
        monkeypatch.setenv(key, value)

    class Toy(BaseConfig):
        x: int = 1

    seen = {}

    def run(config, ctx):
        import torch

        seen.update(device=ctx.device, threads=torch.get_num_threads(), out=ctx.out)
        ctx.metrics["x"] = config.x

    execute(technique=technique, config_cls=Toy, flags={}, common=Common(out=tmp_path / "out", device=device),
            run=run, multi_rank=multi_rank)
    return seen


def test_ranks_each_take_their_own_gpu_and_only_rank_zero_writes(tmp_path, monkeypatch, capsys):
    import cli._ranks as ranks
    import toolkit.core.context as context

    monkeypatch.setattr(context, "resolve_device", lambda requested: "cuda")
    env = {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"}
    seen = _toy_execute(tmp_path, "toy.shared", monkeypatch, env, multi_rank=True)
    assert seen["device"] == "cuda:1" and seen["out"] != tmp_path / "out"
    assert not (tmp_path / "out").exists() and capsys.readouterr().out == ""
    seen = _toy_execute(tmp_path, "toy.shared", monkeypatch, {"RANK": "0", "LOCAL_RANK": "0"}, multi_rank=True)
    assert seen["device"] == "cuda:0" and (tmp_path / "out" / "run.json").exists()
    assert ranks.supports_ranks("remove-ln") and ranks.supports_ranks("unlearn.prism")
    assert ranks.supports_ranks("compress.obr") and ranks.owns_process_group("compress.gptq")
    assert not ranks.supports_ranks("unlearn.eval") and not ranks.supports_ranks("compress.bench")
    assert not ranks.owns_process_group("remove-ln") and not ranks.owns_process_group("compress.bench")


def test_threads_option_and_env_set_torch_once(tmp_path, monkeypatch):
    import torch

    from cli._runner import ROOT_STATE

    before = torch.get_num_threads()
    try:
        monkeypatch.setitem(ROOT_STATE, "threads", None)
        seen = _toy_execute(tmp_path / "a", "toy", monkeypatch, {"ICLRKIT_THREADS": "1"})
        assert seen["threads"] == 1
        monkeypatch.setitem(ROOT_STATE, "threads", 2)  # --threads wins over the environment
        seen = _toy_execute(tmp_path / "b", "toy", monkeypatch, {"ICLRKIT_THREADS": "1"})
        assert seen["threads"] == 2
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("args,env", [(["--threads", "0"], {}), (["--threads", "-3"], {}),
                                      ([], {"ICLRKIT_THREADS": "0"}), ([], {"ICLRKIT_THREADS": "lots"})])
def test_bad_thread_counts_are_one_line_exit_2(cli, tiny_gpt2_dir, monkeypatch, args, env):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    result = cli(args + ["eval", "ppl", "--model", tiny_gpt2_dir, "--data", "embedded", "--max-windows", "1"])
    assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "THREADS" in result.stderr or "--threads" in result.stderr


def test_no_library_code_sets_thread_counts():
    root = Path(__file__).resolve().parents[2] / "toolkit"
    allowed: set[str] = set()
    offenders = [str(p.relative_to(root)) for p in root.rglob("*.py")
                 if "set_num_threads" in p.read_text() and str(p.relative_to(root)) not in allowed]
    assert offenders == []


def test_common_of_maps_command_parameters():
    from cli._runner import Common

    common = Common.of({"out": "o", "set_": ["a=1"], "json_": True, "device": "cuda", "unrelated": 1}, device="cpu")
    assert (common.out, common.set, common.json, common.device, common.dtype) == ("o", ["a=1"], True, "cpu", None)


def test_info_reports_the_thread_count_a_run_would_use(cli, monkeypatch):
    import torch

    before = torch.get_num_threads()
    try:
        result = cli(["--threads", "1", "info", "--json"])
        assert result.exit_code == 0 and json.loads(result.stdout)["threads"] == 1
        assert "iclrkit" in json.loads(result.stdout)["cache"]
    finally:
        torch.set_num_threads(before)
    monkeypatch.setenv("ICLRKIT_THREADS", "0")
    bad = cli(["info"])
    assert bad.exit_code == 2 and bad.stderr.strip().splitlines() == [
        "error: ICLRKIT_THREADS must be at least 1, got 0 (hint: omit it to use torch's default)"]


def test_a_family_that_fails_to_import_says_why_and_info_lists_it(monkeypatch):
    from typer.testing import CliRunner

    import cli.main as main
    from cli.info import collect

    stub = main.broken_family("widgets", "ImportError: no module named 'gizmo'")
    result = CliRunner().invoke(stub, ["run", "--anything"])
    assert result.exit_code == 1
    assert "the 'widgets' commands failed to import: ImportError: no module named 'gizmo'" in result.stderr
    monkeypatch.setitem(main.BROKEN_FAMILIES, "widgets", "ImportError: no module named 'gizmo'")
    assert collect()["broken_families"]["widgets"].startswith("ImportError")


def test_run_json_records_the_commit_the_run_started_from(cli, tmp_path, tiny_gpt2_dir, monkeypatch):
    """A long run while commits land: run.json's git_sha is the commit read when the run started, not HEAD at its
    end (a 100-fact edit recorded the commit that landed an hour after it started)."""
    from types import SimpleNamespace

    import toolkit.eval.perplexity as ppl
    from toolkit.core import report

    head = {"sha": "a" * 40}
    monkeypatch.setattr(report.subprocess, "run", lambda *a, **k: SimpleNamespace(stdout=head["sha"] + "\n"))
    original = ppl.perplexity

    def perplexity_while_a_commit_lands(*args, **kwargs):
        head["sha"] = "b" * 40  # HEAD moves while the run computes
        return original(*args, **kwargs)

    monkeypatch.setattr(ppl, "perplexity", perplexity_while_a_commit_lands)
    getattr(report.git_sha, "cache_clear", lambda: None)()
    try:
        r = cli(["eval", "ppl", "--model", tiny_gpt2_dir, "--data", "embedded", "--max-length", "32",
                 "--max-windows", "1", "--out", tmp_path / "out", "--json"])
        assert r.exit_code == 0, r.stderr
        assert head["sha"] == "b" * 40 and json.loads(r.stdout)["git_sha"] == "a" * 40
    finally:
        getattr(report.git_sha, "cache_clear", lambda: None)()
