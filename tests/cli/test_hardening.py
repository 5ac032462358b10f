"""Issue 29's bad inputs and faults: each gives one line on stderr, the right exit code, and leaves the inputs as
they were."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest


def _digest(path: Path) -> str:
    digest = hashlib.sha256()
    for file in sorted(p for p in Path(path).rglob("*") if p.is_file()):
        digest.update(str(file.relative_to(path)).encode() + file.read_bytes())
    return digest.hexdigest()


def _one_line(result, code: int, *needles: str) -> None:
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == code, result.stderr
    assert len(lines) == 1, result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.fixture()
def zoo(tmp_path, monkeypatch, tiny_gpt2_dir):
    """A private zoo with gpt2-tiny already 'built' (the tiny GPT-2 copied in)."""
    root = tmp_path / "zoo"
    shutil.copytree(tiny_gpt2_dir, root / "gpt2-tiny")
    monkeypatch.setenv("ICLRKIT_ZOO_DIR", str(root))
    return root


PPL = ["eval", "ppl", "--data", "embedded", "--max-windows", "1", "--max-length", "32"]


def test_out_into_the_zoo_cache_is_refused(cli, zoo):
    before = _digest(zoo / "gpt2-tiny")
    result = cli(["--force"] + PPL + ["-m", "zoo:gpt2-tiny", "--out", zoo / "gpt2-tiny", "--overwrite"])
    _one_line(result, 2, "inside the zoo cache")
    result = cli(PPL + ["-m", "zoo:gpt2-tiny", "--out", zoo / "gpt2-tiny" / "sub"])
    _one_line(result, 2, "inside the zoo cache")
    assert _digest(zoo / "gpt2-tiny") == before


def test_zoo_model_hash_and_embedded_text_warning_in_run_json(cli, zoo, tmp_path):
    out = tmp_path / "ppl"
    result = cli(["eval", "ppl", "-m", "zoo:gpt2-tiny", "--max-windows", "1", "--max-length", "32", "--out", out,
                  "--json"])
    assert result.exit_code == 0, result.stderr
    record = json.loads(result.stdout)
    assert record["inputs"]["model"]["sha256"] and record["inputs"]["model"]["resolved"] == str(zoo / "gpt2-tiny")
    assert any("embedded sample text" in w for w in record["warnings"])
    assert "embedded sample text" in result.stderr
    assert record["env"]["threads"] >= 1 and record["caches"] == {}


def test_overwrite_needs_force_for_a_directory_iclrkit_did_not_write(cli, tmp_path, tiny_gpt2_dir):
    precious = tmp_path / "photos"
    precious.mkdir()
    (precious / "cat.jpg").write_bytes(b"\xff\xd8 not really")
    result = cli(PPL + ["-m", tiny_gpt2_dir, "--out", precious, "--overwrite"])
    _one_line(result, 2, "not an iclrkit output", "--force")
    assert (precious / "cat.jpg").read_bytes() == b"\xff\xd8 not really"
    result = cli(["--force"] + PPL + ["-m", tiny_gpt2_dir, "--out", precious, "--overwrite"])
    assert result.exit_code == 0, result.stderr
    assert (precious / "run.json").exists() and not (precious / "cat.jpg").exists()
    again = cli(PPL + ["-m", tiny_gpt2_dir, "--out", precious, "--overwrite"])  # an earlier run: no --force needed
    assert again.exit_code == 0, again.stderr


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory, tiny_tokenizer):
    import torch
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(tiny_tokenizer), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64)
    path = tmp_path_factory.mktemp("bert") / "model"
    BertForMaskedLM(config).save_pretrained(path)
    tiny_tokenizer.save_pretrained(path)
    return path


@pytest.mark.parametrize("command", [PPL, ["compress", "obr", "--nsamples", "2", "--seqlen", "16"]])
def test_encoder_model_is_refused_up_front(cli, bert_dir, tmp_path, command):
    before = _digest(bert_dir)
    out = tmp_path / "out"
    result = cli(command + ["-m", bert_dir, "--out", out])
    _one_line(result, 2, "encoder model", "BertForMaskedLM")
    assert not out.exists() and _digest(bert_dir) == before


def test_truncated_safetensors_names_the_file(cli, tmp_path, tiny_gpt2_dir):
    broken = tmp_path / "broken"
    shutil.copytree(tiny_gpt2_dir, broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    before = _digest(broken)
    result = cli(PPL + ["-m", broken])
    _one_line(result, 2, "corrupt safetensors file", str(weights), "truncated")
    assert _digest(broken) == before


class _Payload:
    def __reduce__(self):
        import os

        return (os.getcwd, ())  # harmless, but not a tensor: a weights-only load must refuse it


def test_malicious_pickle_is_one_line_without_unsafe_advice(cli, tmp_path, tiny_gpt2_dir):
    import pickle

    evil = tmp_path / "evil"
    evil.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        if (tiny_gpt2_dir / name).exists():
            shutil.copy(tiny_gpt2_dir / name, evil / name)
    import torch

    torch.save({"transformer.wte.weight": _Payload()}, evil / "pytorch_model.bin", pickle_module=pickle)
    result = cli(PPL + ["-m", evil])
    _one_line(result, 2, "pickle", "could run code")
    assert "weights_only" not in result.stderr and "False" not in result.stderr


def test_disk_full_during_a_run_is_exit_3_and_leaves_no_partial(cli, tmp_path, tiny_gpt2_dir, monkeypatch):
    import toolkit.eval.perplexity as perplexity

    def full(*args, **kwargs):
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 2097152 vs 2096000")

    monkeypatch.setattr(perplexity, "perplexity", full)
    out = tmp_path / "out"
    result = cli(PPL + ["-m", tiny_gpt2_dir, "--out", out])
    _one_line(result, 3, "no space left on device")
    assert "--resume" not in result.stderr
    assert not out.exists() and not (tmp_path / "out.partial").exists()


def test_sigterm_is_handled_like_ctrl_c(cli, tmp_path, tiny_gpt2_dir, monkeypatch):
    import os
    import signal

    import toolkit.eval.perplexity as perplexity

    def terminated(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        raise AssertionError("SIGTERM did not interrupt the run")

    monkeypatch.setattr(perplexity, "perplexity", terminated)
    out = tmp_path / "out"
    result = cli(PPL + ["-m", tiny_gpt2_dir, "--out", out])
    _one_line(result, 143, "terminated")
    assert not out.exists() and not (tmp_path / "out.partial").exists()
    assert signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None) or callable(signal.getsignal(signal.SIGTERM))


def test_khc_solve_on_a_binary_file_is_exit_2(cli, tmp_path):
    points = tmp_path / "points.csv"
    points.write_bytes(bytes(range(256)) * 4)
    result = cli(["cluster", "khc", "solve", "-d", points, "-k", "2", "--heuristic-only", "--out", tmp_path / "o"])
    _one_line(result, 2, "not UTF-8 text", str(points))
    assert points.read_bytes() == bytes(range(256)) * 4


def test_zoo_build_lock_builds_once_for_two_parallel_builds(tmp_path, monkeypatch):
    import logging
    import sys
    import threading
    import types

    import toolkit.zoo.registry as registry

    monkeypatch.setenv("ICLRKIT_ZOO_DIR", str(tmp_path / "zoo"))
    second_waits = threading.Event()
    calls = []

    def build_fake(out, **kwargs):
        calls.append(out)
        assert second_waits.wait(30), "the second build never reached the lock"
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text("{}")
        return {}

    module = types.ModuleType("fake_zoo_builder")
    module.build_fake = build_fake
    monkeypatch.setitem(sys.modules, "fake_zoo_builder", module)
    monkeypatch.setitem(registry.RECIPES, "fake", registry.Recipe("fake_zoo_builder:build_fake", "test", "0"))

    class Waiting(logging.Handler):
        def emit(self, record):
            if "being built by another process" in record.getMessage():
                second_waits.set()

    handler = Waiting()
    logging.getLogger("iclrkit").addHandler(handler)
    try:
        results = []
        threads = [threading.Thread(target=lambda: results.append(registry.build("fake"))) for _ in range(2)]
        threads[0].start()
        while not calls:  # the first build holds the lock before the second starts
            threads[0].join(0.01)
        threads[1].start()
        for thread in threads:
            thread.join(60)
    finally:
        logging.getLogger("iclrkit").removeHandler(handler)
    assert len(calls) == 1 and len(results) == 2 and registry.is_built("fake")


def test_edit_stats_cache_is_named_in_run_json():
    import datetime as dt

    from toolkit.core.context import RunContext
    from toolkit.core.report import build_run_record

    ctx = RunContext()
    ctx.record_cache("edit-stats", "/somewhere/edit-stats")
    record = build_run_record(command="c", technique="t", config={}, ctx=ctx,
                              started=dt.datetime.now(dt.timezone.utc), duration_s=0.0, status="ok")
    assert record["caches"] == {"edit-stats": "/somewhere/edit-stats"}


def test_help_shows_flags_as_flags_and_completion(cli):
    help_text = cli(["compress", "obr", "--help"]).stdout
    assert "<bool>" not in help_text and "--dry-run" in help_text
    assert "--install-completion" in cli(["--help"]).stdout
    merge_help = cli(["merge", "average", "--help"]).stdout
    assert "--model" in merge_help and "-m" in merge_help


def test_clamped_max_length_is_said_and_recorded(cli, tmp_path, tiny_gpt2_dir):
    out = tmp_path / "ppl"
    result = cli(["eval", "ppl", "-m", tiny_gpt2_dir, "--data", "embedded", "--max-length", "4096",
                  "--max-windows", "1", "--out", out, "--json"])
    assert result.exit_code == 0, result.stderr
    assert "--max-length 4096 clamped to 128" in result.stderr
    assert any("clamped to 128" in w for w in json.loads(result.stdout)["warnings"])
