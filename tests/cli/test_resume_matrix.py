"""Interrupted runs, for every command that offers --resume (found by walking the CLI): a run interrupted at the
first step after a checkpoint was written exits 130 with one error line naming OUT.partial, leaves no OUT, and the
same command with --resume finishes it bit-identically to an uninterrupted run.

The interrupt is generic: progress (every long loop's iterator, `ctx.progress`) raises KeyboardInterrupt when asked
for its next item while OUT.partial/checkpoints holds a file. A command's arguments come from its family's recipe
(tiny inputs); a new resumable command of a known family is covered by itself, a new family needs a recipe."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from testkit import run_iclrkit

pytestmark = pytest.mark.usefixtures("one_thread")


def _resumable():
    from cli.main import root_command

    found = []

    def walk(command, path):
        for name, sub in sorted((getattr(command, "commands", None) or {}).items()):
            walk(sub, (*path, name))
        spec = getattr(getattr(command, "callback", None), "iclrkit_spec", None)
        if spec and "resume" in spec["common"]:
            found.append(path)

    walk(root_command(), ())
    return found


RESUMABLE = _resumable()


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, tiny_gpt2_dir, tiny_llama_dir):
    """Tiny inputs, each in a folder of its own: models, calibration text, forget/retain sets, a merge zoo (built on
    first use)."""
    from toolkit.data.text import embedded_text

    root = tmp_path_factory.mktemp("resume-inputs")
    text = embedded_text()[:40_000]
    (root / "text").mkdir()
    (root / "text" / "text.txt").write_text(text)
    docs = [text[i:i + 300] for i in range(0, 3000, 300)]
    (root / "unlearn").mkdir()
    (root / "unlearn" / "forget.json").write_text(json.dumps(docs[:4]))
    (root / "unlearn" / "retain.jsonl").write_text("\n".join(json.dumps({"text": d}) for d in docs[4:8]))
    return {"root": root, "gpt2": tiny_gpt2_dir, "llama": tiny_llama_dir, "text": root / "text" / "text.txt",
            "forget": root / "unlearn" / "forget.json", "retain": root / "unlearn" / "retain.jsonl"}


def _merge_zoo(inputs) -> Path:
    zoo = inputs["root"] / "merge-zoo"
    if not zoo.exists():
        made = run_iclrkit(["merge", "zoo", "--set", "widths=[8,4]", "--set", "seeds=[0,1]", "--set",
                            "backbone_epochs=1", "--set", "finetune_epochs=1", "-o", zoo])
        assert made.exit_code == 0, made
    return zoo / "models"


# Per family (the first word of the command): arguments on tiny inputs that write checkpoints early and often.
RECIPES = {
    "compress": lambda i: ["-m", i["llama"], "-d", i["text"], "--nsamples", "2", "--seqlen", "16", "--set",
                           "eval_windows=1", "--set", "eval_max_length=16", "--set", "export=packed"],
    "unlearn": lambda i: ["-m", i["gpt2"], "-f", i["forget"], "-r", i["retain"], "--max-length", "24", "--epochs",
                          "2", "--batch-size", "2", "--lr", "1e-3", "--set", "checkpoint_every=1"],
    "remove-ln": lambda i: ["-m", i["gpt2"], "-d", i["text"], "--steps", "32", "--batch-size", "2", "--seqlen",
                            "16", "--set", "eval_windows=2", "--set", "calibration_batches=1", "--set",
                            "checkpoint_every=8"],
    "merge": lambda i: ["-m", _merge_zoo(i), "--target", _merge_zoo(i) / "w8-s0-5to9", "--stage1-steps", "6",
                        "--stage2-steps", "4", "--set", "d_model=16", "--set", "heads=2", "--set", "encoder_layers=1",
                        "--set", "decoder_layers=1", "--set", "latent_dim=16", "--set", "window=4", "--set",
                        "compression=2", "--set", "batch_size=8", "--set", "checkpoint_every=2"],
}
# What one command adds to its family's recipe.
EXTRA = {"unlearn rmu": ["--layer", "1"], "compress recipe": ["--set", "stages=[sparsegpt, gptq]"], "unlearn prism": ["--probe-layer", "1", "--set", "probe_epochs=2"]}
# Files that name the command or the time, not the result.
NOT_RESULTS = {"run.json", "config.resolved.yaml", "README.md"}


def test_every_resumable_command_has_a_recipe():
    assert len(RESUMABLE) >= 10
    missing = sorted({path[0] for path in RESUMABLE} - set(RECIPES))
    assert not missing, f"add a --resume recipe for the families {missing}"


def _interrupt_after_a_checkpoint(monkeypatch, partial: Path) -> list:
    import toolkit.core.progress as progress_module

    real = progress_module.progress
    fired: list = []

    def progress(iterable, *args, **kwargs):
        for index, item in enumerate(real(iterable, *args, **kwargs)):
            checkpoints = partial / "checkpoints"
            if index and not fired and checkpoints.is_dir() and any(p.is_file() for p in checkpoints.rglob("*")):
                fired.append(index)
                raise KeyboardInterrupt
            yield item

    monkeypatch.setattr(progress_module, "progress", progress)
    return fired


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name not in NOT_RESULTS}


@pytest.mark.parametrize("path", RESUMABLE, ids=[" ".join(p) for p in RESUMABLE])
def test_interrupted_run_resumes_bit_identically(path, inputs, tmp_path, monkeypatch):
    name = " ".join(path)
    args = [*path, *RECIPES[path[0]](inputs), *EXTRA.get(name, [])]
    reference = run_iclrkit([*args, "-o", tmp_path / "reference"])
    assert reference.exit_code == 0, f"{name}: {reference}"
    out = tmp_path / "out"
    fired = _interrupt_after_a_checkpoint(monkeypatch, tmp_path / "out.partial")
    interrupted = run_iclrkit([*args, "-o", out])
    monkeypatch.undo()
    assert fired, f"{name}: no checkpoint was written before its last loop step (recipe too short?)"
    errors = [line for line in interrupted.stderr.strip().splitlines() if line.startswith("error:")]
    assert interrupted.exit_code == 130 and len(errors) == 1, f"{name}: {interrupted}"
    assert str(tmp_path / "out.partial") in errors[0] and "--resume" in errors[0], errors[0]
    assert not out.exists() and (tmp_path / "out.partial" / "checkpoints").is_dir()
    resumed = run_iclrkit([*args, "-o", out, "--resume"])
    assert resumed.exit_code == 0, f"{name}: {resumed}"
    assert not (tmp_path / "out.partial").exists() and not (out / "checkpoints").exists()
    expected, got = _files(tmp_path / "reference"), _files(out)
    assert sorted(got) == sorted(expected), name
    differ = [file for file in expected if expected[file] != got[file]]
    assert not differ, f"{name}: the resumed run differs from an uninterrupted one in {differ}"
