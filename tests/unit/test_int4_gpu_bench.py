"""scripts/gpu_bench.py (the timing half of `make gpu-check`) runs end to end on the CPU with tiny shapes and
writes the JSON the GPU check records; its figures are not measurements of anything."""

import json
from pathlib import Path

import pytest
from testkit import load_script

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.usefixtures("one_thread")


def _module():
    return load_script(ROOT / "scripts" / "gpu_bench.py", "gpu_bench")


def test_quick_run_on_cpu_writes_every_section(tmp_path):
    out = tmp_path / "bench.json"
    assert _module().main(["--device", "cpu", "--quick", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["device"] == "cpu" and result["quick"] is True
    kernels = {(r["kernel"], r["m"]) for r in result["int4"]}
    assert kernels == {(k, m) for k in ("w4a16", "w4a8_dense", "w4a8_24") for m in (1, 3)}
    assert all(r["ms"] > 0 and r["dense_ms"] > 0 for r in result["int4"])
    conv = result["binary_conv"]
    assert conv["layers"] and all(r["packed_ms"] > 0 for r in conv["layers"]) and conv["network_packed_ms"] > 0
    assert set(result["compiled_kernels"]) >= {"int4_gemm", "w4a16_gemm", "ternary_conv2d_sign"}


def test_gpu_check_script_parses_and_its_step_limits_fit_one_device_command():
    import re
    import subprocess

    script = ROOT / "scripts" / "gpu-check.sh"
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    limits = [int(x) for line in re.findall(r"^step \w+ (\S+)", script.read_text(), re.M)
              for x in re.findall(r"\d+", line)]
    # nine steps (issue 42 added obr_block) within the 10 minutes one device command may run, with room to finish
    assert len(limits) == 9 and sum(limits) <= 580, limits
    makefile = (ROOT / "Makefile").read_text()
    assert "gpu-check:" in makefile and "bash scripts/gpu-check.sh" in makefile and "gpu-wheels:" in makefile
