"""Every example printed in a `--help` epilog parses, resolves to a valid config and carries --out where the command
needs one (the runner is swapped for a recorder: no model is trained here); a few run for real on tiny inputs."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest


def _examples() -> list[tuple[str, list[str]]]:
    import typer

    from cli.main import app

    found: list[tuple[str, list[str]]] = []

    def walk(command, path: str) -> None:
        epilog = getattr(command, "epilog", None) or ""
        if "Examples:" in epilog:
            for text in epilog.split("Examples:", 1)[1].split(" | "):
                text = re.sub(r"\s*\([^)]*\)\s*$", "", text.split("&&")[0]).strip()  # shell chains, remarks
                if text.startswith("iclrkit "):
                    found.append((text, shlex.split(text)[1:]))
        for name, sub in sorted((getattr(command, "commands", None) or {}).items()):
            walk(sub, f"{path} {name}")

    walk(typer.main.get_command(app), "iclrkit")
    return found


EXAMPLES = _examples()


def test_there_are_examples_for_most_commands():
    assert len(EXAMPLES) >= 40


@pytest.mark.parametrize("text,args", EXAMPLES, ids=[text[:70] for text, _ in EXAMPLES])
def test_help_example_parses_and_resolves(text, args, cli, monkeypatch, tmp_path):
    import cli._runner as runner
    from toolkit.core.config import resolve_config

    seen = {}

    def record(technique, config_cls, flags, common, run, inputs, plan, needs_out, multi_rank):
        seen.update(technique=technique, needs_out=needs_out, out=common.out, dry_run=common.dry_run)
        resolve_config(config_cls, common.config, common.set, flags)  # unknown keys / bad values fail here

    monkeypatch.setattr(runner, "_execute", record)
    if args[:2] == ["zoo", "build"]:
        import toolkit.zoo.registry as registry

        monkeypatch.setattr(registry, "build", lambda name, **kw: (tmp_path / name, {}))
    monkeypatch.chdir(Path(__file__).resolve().parents[2])  # examples name repo files (examples/...) from the root
    from cli.main import move_root_options

    result = cli(move_root_options(args))
    users_file = result.exit_code == 2 and "not found" in result.stderr and any(
        token in result.stderr for token in args if not token.startswith("-") and ("." in token or "/" in token))
    assert result.exit_code == 0 or users_file, f"{text}\n{result.stdout}\n{result.stderr}"
    if seen:
        assert not seen["needs_out"] or seen["out"] is not None or seen["dry_run"], \
            f"{text}: this command needs --out, the example omits it"


def test_cluster_help_examples_run_for_real(cli, tmp_path):
    points = tmp_path / "pts"
    made = cli(["cluster", "khc", "generate", "-n", "24", "--dim", "2", "-k", "2", "--seed", "1", "--out", points])
    assert made.exit_code == 0, made.stderr
    data = next(p for p in points.iterdir() if p.suffix in (".csv", ".npy"))
    result = cli(["cluster", "khc", "solve", "-d", data, "-k", "2", "--heuristic-only", "--no-plot",
                  "--out", tmp_path / "kplanes", "--json"])
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["status"] == "ok"


# The examples that run for real, as printed, in a scratch working directory: zoo names resolve to the tiny models
# (zoo:gpt2-small is the tiny GPT-2, zoo:llama-small and zoo:smollm2-135m the tiny Llama), each file an example names
# after -m/--model is a copy of a tiny model and after -d/--data/--eval-data a text file. Families whose defaults
# train for minutes on 2 cores (study, segment, explain, merge zoos, edit, unlearn, remove-ln, DeepRAG, MHLP,
# steering, TokUR, benchmarks, compress bench, a zoo build on new data), score the whole 465K-character embedded
# text (`eval ppl --data embedded`: ~45 s here; test_hardening scores it with --max-windows) or need a server stay
# parsed and validated above.
RUN_FOR_REAL = (("info",), ("zoo", "build"), ("eval", "ppl"), ("compress",), ("cluster", "khc", "generate"))
STAND_INS = {"gpt2-small": "gpt2", "gpt2-tiny": "gpt2", "llama-small": "llama", "smollm2-135m": "llama"}
MODEL_FLAGS, DATA_FLAGS = ("-m", "--model"), ("-d", "--data", "--eval-data")


def _runs_for_real(args: list[str]) -> bool:
    if any(token.startswith(("openai:", "http")) for token in args) or args[:2] == ["compress", "bench"]:
        return False
    if args[:2] == ["zoo", "build"] and ("--data" in args or "-d" in args) or "embedded" in args:
        return False
    return any(tuple(args[:len(prefix)]) == prefix for prefix in RUN_FOR_REAL)


REAL = [(text, args) for text, args in EXAMPLES if _runs_for_real(args)]


def test_the_examples_that_run_for_real_cover_the_reported_one():
    assert any("--max-length 1024 --stride 512" in text for text, _ in REAL) and len(REAL) >= 10


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("text,args", REAL, ids=[text[:70] for text, _ in REAL])
def test_help_example_runs_as_printed(text, args, tmp_path, monkeypatch, tiny_gpt2_dir, tiny_llama_dir):
    import shutil

    from testkit import run_iclrkit

    from toolkit.data.text import embedded_text

    models = {"gpt2": tiny_gpt2_dir, "llama": tiny_llama_dir}
    zoo = tmp_path / "zoo"
    for name, family in STAND_INS.items():
        shutil.copytree(models[family], zoo / name)
    monkeypatch.setenv("ICLRKIT_ZOO_DIR", str(zoo))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    for flag, value in zip(args, args[1:]):
        if value.startswith("zoo:") or value in ("embedded",) or (work / value).exists():
            continue
        repo_file = Path(__file__).resolve().parents[2] / value
        if repo_file.is_file():  # a file the project ships (examples/compress-recipes/...), at its relative path
            (work / value).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(repo_file, work / value)
        elif flag in MODEL_FLAGS:
            shutil.copytree(models["gpt2" if "gpt2" in value else "llama"], work / value)
        elif flag in DATA_FLAGS:
            (work / value).parent.mkdir(parents=True, exist_ok=True)
            (work / value).write_text(embedded_text()[:5000])
    import torch

    threads = torch.get_num_threads()
    try:
        result = run_iclrkit(args)
    finally:
        torch.set_num_threads(threads)
    assert result.exit_code == 0, f"{text}\n{result.stderr}"
