"""scripts/obr_block_check.py (make gpu-check's OBR row, issue 42) and examples/scale/gpu_plan.py on the CPU: the same
script path as the 7B-shaped CUDA run, on a tiny shape."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from testkit import load_script

ROOT = Path(__file__).resolve().parents[2]


def test_block_check_runs_both_methods_and_projects_the_same_block(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "examples" / "scale"))
    check = load_script(ROOT / "scripts" / "obr_block_check.py", "obr_block_check")
    assert check.main(["--device", "cpu", "--shape", "tiny", "--nsamples", "2", "--seqlen", "16",
                       "--out", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "obr_block.json").read_text())
    assert record["status"] == "done" and record["device"] == "cpu"
    linears = record["runs"]["obr"]["linears"]
    assert len(linears) == 7 and all(len(r["solves"]) == 2 for r in linears)  # pruning + quantization solve
    for solve in (s for r in linears for s in r["solves"]):
        assert solve["method"] == "pcg-deflation" and solve["iterations"] > 0 and solve["excess"] <= 1e-3
    assert record["iterations"] == [max(r["solves"][0]["iterations"] for r in linears),
                                    max(r["solves"][1]["iterations"] for r in linears)]
    projection = record["projection"]
    assert projection["tokens"] == 32 and projection["obr_s_per_block"] > 0 and projection["gptq_s_per_block"] > 0
    assert all(record["measured_s_per_block"][m] > 0 for m in ("gptq", "obr"))
    assert record["runs"]["obr"]["sparsity"] >= 0.5


def test_gpu_plan_counts_grow_with_the_iterations_and_the_shape():
    sys.path.insert(0, str(ROOT / "examples" / "scale"))
    plan = load_script(ROOT / "examples" / "scale" / "gpu_plan.py", "gpu_plan")
    few, many = plan.plan((5, 5)), plan.plan((30, 15))
    by_shape = {r["shape"]: r for r in many}
    assert set(by_shape) == {"Llama-2-7B", "Llama-3-70B", "Qwen3-235B-A22B"}
    for a, b in zip(few, many):
        assert a["gptq_tflop_per_block"] == b["gptq_tflop_per_block"]  # GPTQ does not iterate
        assert b["obr_tflop_per_block"] > a["obr_tflop_per_block"] > a["gptq_tflop_per_block"]
    assert by_shape["Llama-3-70B"]["obr_s_per_block"] > by_shape["Llama-2-7B"]["obr_s_per_block"]
    assert by_shape["Qwen3-235B-A22B"]["linears_per_block"] == 4 + 3 * 128  # attention + 128 experts
    # the exact batched Cholesky would hold every row's H_RR: terabytes at 70B, which is why cuda runs cg
    assert by_shape["Llama-3-70B"]["cholesky_all_rows_gb"] > 1000 > by_shape["Llama-3-70B"]["obr_solve_peak_gb"]
    # one hand-checked count: Llama-2-7B's Hessians alone, n·C² per group (q/k/v, o, gate/up share 4096; down 11008)
    tokens = by_shape["Llama-2-7B"]["tokens"]
    hessians = tokens * (3 * 4096 ** 2 + 11008 ** 2)
    assert by_shape["Llama-2-7B"]["gptq_tflop_per_block"] * 1e12 > hessians
