"""examples/gguf/agreement.py stamps every record it writes (the file's top level and each row) with
scripts/provenance.py's fields. The benchmark itself needs llama-cpp-python; here `run_one` is replaced (one model
refused, one raising), so only the writer runs."""

import json
import sys
from pathlib import Path

import pytest
from testkit import load_script

ROOT = Path(__file__).resolve().parents[2]
AGREEMENT = load_script(ROOT / "examples" / "gguf" / "agreement.py", "gguf_agreement")
provenance = load_script(ROOT / "scripts" / "provenance.py", "provenance_script")
pytestmark = pytest.mark.usefixtures("one_thread")


def test_every_record_the_benchmark_writes_carries_its_provenance(tmp_path, monkeypatch):
    import toolkit.zoo.lm

    def run_one(label, model, *args):
        if label == "llama":
            return {"model": label, "command": f"iclrkit compress rtn -m {model} --set export=gguf",
                    "status": "refused", "reason": "error: refused"}
        raise RuntimeError("no interpreter")

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(AGREEMENT, "run_one", run_one)
    monkeypatch.setattr(AGREEMENT, "_tiny_model", lambda label, work, tokenizer: work / label)
    monkeypatch.setattr(toolkit.zoo.lm, "train_tokenizer", lambda text, vocab_size: None)
    results, rendered = tmp_path / "results.json", tmp_path / "RESULTS.md"
    argv = ["--archs", "llama", "qwen2", "--no-real", "--python", sys.executable, "--work", str(tmp_path / "w"),
            "--results", str(results), "--render", str(rendered)]
    assert AGREEMENT.main(argv) == 0
    data = json.loads(results.read_text())
    records = provenance.records(data)
    assert [where for where, _ in records] == ["top level", "rows[0]", "rows[1]"]
    assert all(provenance.missing(record) == [] for _, record in records)
    top, (refused, failed) = data, data["rows"]
    commit = provenance.code_state().split("+")[0]
    for record in (top, refused, failed):
        assert record["commit"] == commit and record["repro"] == "examples/gguf/agreement.py" and record["seed"] == 0
        assert record["machine"]["cores"] >= 1 and len(record["machine"]["load_start"]) == 3
    assert top["command"] == "python examples/gguf/agreement.py " + " ".join(argv)
    assert refused["command"].startswith("iclrkit compress rtn -m ")  # a row keeps its own command
    assert failed["status"] == "failed" and failed["command"] == top["command"]
    assert f"at commit `{commit}`" in rendered.read_text() and " cores; " in rendered.read_text()


def test_merge_redoes_rows_in_place_and_keeps_the_others(tmp_path, monkeypatch):
    import toolkit.zoo.lm

    seen = []

    def run_one(label, model, work, python, new_tokens, length, calibration, extra, method="rtn"):
        seen.append((label, method))
        return {"model": label, "command": f"iclrkit compress {method} -m {model}", "status": "refused",
                "reason": f"error: run {len(seen)}"}

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(AGREEMENT, "run_one", run_one)
    monkeypatch.setattr(AGREEMENT, "_tiny_model", lambda label, work, tokenizer: work / label)
    monkeypatch.setattr(toolkit.zoo.lm, "train_tokenizer", lambda text, vocab_size: None)
    results = tmp_path / "results.json"
    common = ["--python", sys.executable, "--work", str(tmp_path / "w"), "--results", str(results),
              "--render", str(tmp_path / "RESULTS.md")]
    assert AGREEMENT.main(["--archs", "llama", "qwen2", "gemma", "--no-real", *common]) == 0
    assert AGREEMENT.main(["--archs", "qwen2", "--real", "m=/some/dir", "--methods", "rtn", "gptq", "--merge",
                           *common]) == 0
    rows = json.loads(results.read_text())["rows"]
    assert [r["model"] for r in rows] == ["llama", "qwen2", "gemma", "m", "m [gptq]"]
    assert [r["reason"] for r in rows] == ["error: run 1", "error: run 4", "error: run 3", "error: run 5",
                                           "error: run 6"]
    assert seen[-2:] == [("m", "rtn"), ("m [gptq]", "gptq")] and rows[-1]["command"].startswith("iclrkit compress gptq")
    assert "Rows of several runs" in (tmp_path / "RESULTS.md").read_text()
