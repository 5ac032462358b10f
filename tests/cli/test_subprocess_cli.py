"""The real console script (`.venv/bin/iclrkit`) as a subprocess: exit codes, stdout holds only the JSON, stderr the
progress lines and one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

EXE = Path(sys.executable).parent / "iclrkit"
pytestmark = pytest.mark.skipif(not EXE.exists(), reason="console script not installed (make install)")


def iclrkit(*args, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    full = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run([str(EXE), *map(str, args)], capture_output=True, text=True, env=full, timeout=timeout,
                          stdin=subprocess.DEVNULL)


PPL = ["eval", "ppl", "--data", "embedded", "--max-windows", "3", "--max-length", "32", "--json"]


def test_non_tty_run_logs_progress_on_stderr_and_only_json_on_stdout(tiny_gpt2_dir):
    result = iclrkit(*PPL, "-m", tiny_gpt2_dir, env={"ICLRKIT_PROGRESS_EVERY": "0"})
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout)  # nothing else on stdout
    assert record["metrics"]["ppl"] > 1
    lines = [line for line in result.stderr.splitlines() if line.startswith("progress ppl ")]
    assert [line.split()[2] for line in lines] == ["1/3", "2/3", "3/3"]
    assert all(" elapsed " in line and " eta " in line for line in lines)


def test_quiet_after_the_subcommand_silences_progress(tiny_gpt2_dir):
    result = iclrkit(*PPL, "-m", tiny_gpt2_dir, "-q", env={"ICLRKIT_PROGRESS_EVERY": "0"})
    assert result.returncode == 0, result.stderr
    assert result.stderr == "" and json.loads(result.stdout)["status"] == "ok"


def test_root_options_after_the_subcommand():
    from cli.main import move_root_options

    assert move_root_options(["eval", "ppl", "-m", "x", "-q", "--offline", "--threads", "2"]) == \
        ["-q", "--offline", "--threads", "2", "eval", "ppl", "-m", "x"]
    assert move_root_options(["zoo", "build", "gpt2-tiny", "--force"]) == ["zoo", "build", "gpt2-tiny", "--force"]
    assert move_root_options(["-v", "eval", "ppl", "-vv", "--", "-q"]) == ["-vv", "-v", "eval", "ppl", "--", "-q"]
    result = iclrkit("eval", "ppl", "-m", "/no/such/model", "--offline", "-q")
    assert result.returncode == 2 and result.stderr.strip() == "error: model path not found: /no/such/model"


@pytest.mark.parametrize("args,needle", [
    (["eval", "ppl", "--bogus"], "No such option: --bogus"),
    (["eval", "ppl"], "Missing option '--model'"),
    (["eval", "ppl", "-m", "x", "--max-length", "many"], "Invalid value for '--max-length'"),
])
def test_usage_errors_are_one_line_exit_2(args, needle):
    result = iclrkit(*args)
    assert result.returncode == 2 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and lines[0].startswith("error: ")


def test_threads_zero_is_one_line_exit_2():
    result = iclrkit("eval", "ppl", "-m", "x", "--threads", "0")
    assert result.returncode == 2 and result.stderr.strip().splitlines() == [
        "error: --threads must be at least 1, got 0 (hint: omit it to use torch's default)"]


def test_unreachable_hub_is_one_line_exit_3_and_fast(tmp_path):
    env = {"HF_HUB_OFFLINE": "0", "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HOME": str(tmp_path / "hf"),
           "HTTPS_PROXY": "", "HTTP_PROXY": "", "ALL_PROXY": "", "https_proxy": "", "http_proxy": "", "all_proxy": ""}
    result = iclrkit("eval", "ppl", "-m", "some-org/some-model", "--data", "embedded", env=env, timeout=60)
    assert result.returncode == 3, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "unreachable" in lines[0] and "Retrying" not in result.stderr


def test_version_and_info_json_on_stdout():
    assert iclrkit("--version").stdout.startswith("iclrkit ")
    info = iclrkit("info", "--json")
    assert info.returncode == 0 and json.loads(info.stdout)["torch"]


def test_completion_script_is_available():
    result = iclrkit("--show-completion", "bash", env={"SHELL": "/bin/bash"})
    assert result.returncode == 0 and "complete" in result.stdout and "iclrkit" in result.stdout
