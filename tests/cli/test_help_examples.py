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
