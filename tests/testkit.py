"""Helpers the tests share (tiny models of every architecture: toolkit.models.tiny): importable as `from testkit import ...`, as tests/ is on
sys.path under pytest (tests/conftest.py)."""

from __future__ import annotations

import contextlib
import importlib.util
import textwrap
from pathlib import Path
from types import ModuleType


def load_script(path: Path, name: str) -> ModuleType:
    """A script that is not in a package (examples/*/x.py, scripts/x.py), imported from its file as module `name`."""
    import sys

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses (and pickling) look their module up there while it executes
    spec.loader.exec_module(module)
    return module


def assert_bad_inputs(cli, command: list, cases, out: Path, out_flag: str = "-o") -> None:
    """Each (args, message) of `cases`: `command + args + [out_flag, out]` exits 2, says `message` on stderr and
    leaves no `out` behind."""
    for args, message in cases:
        r = cli([*command, *args, out_flag, out])
        assert r.exit_code == 2, (args, r.stderr)
        assert message in r.stderr, (message, r.stderr)
        assert not out.exists()


@contextlib.contextmanager
def throwaway_method(tmp_path: Path, kind: str, source: str, cli_module: str):
    """A method of registry `kind` that only this test has: `source` written as a module under tmp_path and
    imported (its @register runs), the room's CLI module rebuilt so its commands see it; all undone afterwards.
    Yields the module."""
    import importlib
    import sys
    import uuid

    from toolkit.core.registry import registry

    name = f"throwaway_{kind}_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    sys.path.insert(0, str(tmp_path))

    def rebuild():
        importlib.reload(importlib.import_module(cli_module))
        importlib.reload(importlib.import_module("cli.main"))

    try:
        module = importlib.import_module(name)
        rebuild()
        yield module
    finally:
        entries = registry(kind)._entries
        for key in [k for k, e in entries.items() if getattr(e.obj, "__module__", "") == name]:
            entries.pop(key)
        sys.modules.pop(name, None)
        sys.path.remove(str(tmp_path))
        rebuild()


class Invocation:
    """What `iclrkit ARGS` did: exit_code, stdout, stderr (text)."""

    def __init__(self, exit_code: int, stdout: str, stderr: str) -> None:
        self.exit_code, self.stdout, self.stderr = exit_code, stdout, stderr

    def __repr__(self) -> str:
        return f"Invocation(exit_code={self.exit_code}, stderr={self.stderr.strip()[-300:]!r})"


def run_iclrkit(args: list) -> Invocation:
    """Run the console script's entry point (cli.main.main) in-process, as a shell user would: root options moved,
    usage errors as one line (the `cli` fixture invokes the Typer app, whose usage errors are a rich panel)."""
    from typer.testing import CliRunner

    from cli.main import main

    with CliRunner().isolation() as (stdout, stderr, _):
        try:
            main([str(a) for a in args])
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        return Invocation(code, stdout.getvalue().decode(errors="replace"), stderr.getvalue().decode(errors="replace"))
