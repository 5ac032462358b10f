"""The one JSON writer of the house: result files (`results.json`, reports) and per-record logs (`*.jsonl`).

`write_json` (and `write_jsonl`, a whole JSON-lines file) writes through a temporary file and a rename, so a reader
never sees half a file; `JsonlWriter` appends one compact line per record and flushes it (a killed run keeps every
finished record)."""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path
from typing import Any, Iterable


def dumps(payload: Any, indent: int | None = 2) -> str:
    return json.dumps(payload, indent=indent, default=str, ensure_ascii=False)


def _replace_with(path: str | Path, text: str) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return path


def write_json(path: str | Path, payload: Any, indent: int | None = 2) -> Path:
    return _replace_with(path, dumps(payload, indent) + "\n")


def write_jsonl(path: str | Path, records: Iterable[Any]) -> Path:
    """A whole JSON-lines file (one compact record a line) written at once, through a rename like `write_json`."""
    return _replace_with(path, "".join(dumps(record, indent=None) + "\n" for record in records))


def read_json(path: str | Path) -> Any:
    return json.loads(Path(path).read_text(encoding="utf-8"))


class JsonlWriter:
    """with JsonlWriter(ctx.path("log.jsonl")) as log: log.write({...})"""

    def __init__(self, path: str | Path, append: bool = False) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._handle = self.path.open("a" if append else "w", encoding="utf-8")

    def write(self, record: Any) -> None:
        self._handle.write(dumps(record, indent=None) + "\n")
        self._handle.flush()

    def write_all(self, records: Iterable[Any]) -> None:
        for record in records:
            self.write(record)

    def close(self) -> None:
        self._handle.close()

    def __enter__(self) -> "JsonlWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def command_line() -> str:
    """The real command as typed (sys.argv), quoted so it can be pasted back: what model cards and records name."""
    argv = list(sys.argv)
    if argv and Path(argv[0]).name in ("iclrkit", "__main__.py", "main.py"):
        argv[0] = "iclrkit"
    return " ".join(shlex.quote(a) for a in argv)
