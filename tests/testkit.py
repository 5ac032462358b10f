"""Helpers the tests share (tiny models of every architecture: toolkit.models.tiny): importable as `from testkit import ...`, as tests/ is on
sys.path under pytest (tests/conftest.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType


def load_script(path: Path, name: str) -> ModuleType:
    """A script that is not in a package (examples/*/x.py, scripts/x.py), imported from its file as module `name`."""
    import sys

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses resolve string annotations through the module's entry
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
