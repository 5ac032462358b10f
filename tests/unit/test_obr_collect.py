"""examples/obr/collect.py: results.json rows from a repro folder, and the merge of serve_check.json's columns."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from testkit import load_script

COLLECT = Path(__file__).resolve().parents[2] / "examples" / "obr" / "collect.py"


@pytest.fixture(scope="module")
def collect():
    return load_script(COLLECT, "obr_collect")


def _record(path: Path, ppl: float, **metrics) -> None:
    path.mkdir(parents=True)
    (path / "run.json").write_text(json.dumps({"seed": 0, "metrics": {"ppl": ppl, **metrics}}))


@pytest.fixture()
def repro(tmp_path):
    out = tmp_path / "repro-obr"
    _record(out / "smol" / "dense", 20.0)
    _record(out / "smol" / "w4a16-s50" / "obr-gptq", 30.0, packed_mb=40.0, compress_seconds=12.34, sparsity=0.5,
            fp16_mb=270.0)
    _record(out / "smol" / "w4a16-s50" / "sparsegpt-gptq", 31.0, packed_mb=40.0, compress_seconds=5.0, sparsity=0.5)
    _record(out / "smol" / "w4a4kv4-2-4" / "obr-gptq", 50.0, packed_mb=41.0)
    return out


def _rows(out: Path) -> list[dict]:
    return json.loads((out / "results.json").read_text())["rows"]


def test_without_serve_check_rows_and_keys_are_the_plain_ones(collect, repro, capsys):
    collect.main(repro)
    rows = _rows(repro)
    assert [(r["setting"], r["method"]) for r in rows] == [
        ("fp16", "FP dense"), ("w4a16-s50", "SparseGPT+GPTQ"), ("w4a16-s50", "OBR_GPTQ"), ("w4a4kv4-2:4", "OBR_GPTQ")]
    plain = {"model", "setting", "method", "ppl", "seed", "size_mb", "seconds", "sparsity",
             "linear_size_ratio_vs_fp16", "size_ratio_vs_fp16"}
    assert all(set(r) == plain for r in rows)
    assert rows[0]["size_mb"] == 270.0 and rows[2]["seconds"] == 12.3
    assert "llama.cpp" not in capsys.readouterr().out


def test_serve_check_columns_merge_into_matching_rows(collect, repro, capsys):
    serve = {"rows": [
        {"model": "smol", "setting": "w4a16-s50", "method": "OBR_GPTQ", "llamacpp_agreement": 0.8125,
         "ct_reload_max_abs_diff": 3.1e-5, "sst2_acc": 0.6, "sst2_acc_stderr": 0.04, "counterfact_acc": 0.7,
         "counterfact_acc_stderr": 0.037, "ppl": -1.0},
        {"model": "smol", "setting": "fp16", "method": "FP dense", "llamacpp_agreement": None,
         "ct_reload_max_abs_diff": None, "sst2_acc": 0.65, "sst2_acc_stderr": 0.039},
        {"model": "smol", "setting": "w4a16-s50", "method": "RTN", "llamacpp_agreement": 1.0}]}
    (repro / "serve_check.json").write_text(json.dumps(serve))
    collect.main(repro)
    rows = {(r["setting"], r["method"]): r for r in _rows(repro)}
    obr = rows[("w4a16-s50", "OBR_GPTQ")]
    assert obr["llamacpp_agreement"] == 0.8125 and obr["ct_reload_max_abs_diff"] == 3.1e-5
    assert obr["counterfact_acc"] == 0.7 and obr["sst2_acc_stderr"] == 0.04
    assert obr["ppl"] == 30.0  # a results key is never overwritten by a serve-check column
    assert rows[("fp16", "FP dense")]["sst2_acc"] == 0.65
    assert "llamacpp_agreement" not in rows[("w4a16-s50", "SparseGPT+GPTQ")]
    assert "llamacpp_agreement" not in rows[("w4a4kv4-2:4", "OBR_GPTQ")]  # same method, other setting
    assert len(rows) == 4  # the unmatched RTN row adds nothing
    captured = capsys.readouterr()
    assert "no results row for smol w4a16-s50 RTN" in captured.err
    table = captured.out.split("llama.cpp", 1)[1]
    assert "0.812" in table and "3.10e-05" in table and "0.700 +- 0.037" in table


def test_merge_returns_unmatched_and_keeps_existing_keys(collect):
    rows = [{"model": "m", "setting": "s", "method": "A", "ppl": 1.0}]
    unmatched = collect.merge_serve_check(rows, [{"model": "m", "setting": "s", "method": "A", "ppl": 9.0, "x": 1},
                                                 {"model": "m", "setting": "s", "method": "B", "x": 2}])
    assert rows == [{"model": "m", "setting": "s", "method": "A", "ppl": 1.0, "x": 1}]
    assert [r["method"] for r in unmatched] == ["B"]


def test_row_key_maps_folders_to_table_names(collect):
    assert collect.row_key(("smol", "dense")) == ("smol", "fp16", "FP dense")
    assert collect.row_key(("smol", "w4a4kv4-2-4", "sparsegpt-two-stage")) == \
        ("smol", "w4a4kv4-2:4", "SparseGPT->GPTQ two-stage")
    assert collect.row_key(("smol", "w4a16", "custom")) == ("smol", "w4a16", "custom")
