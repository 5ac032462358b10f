"""Progress on stderr: a rich bar on a terminal, steady one-line logs when stderr is not a TTY (CI, nohup, pipes).

Every long loop goes through `RunContext.progress` (or a `progress=` callable a command passes down), so all of
them get the same behaviour; `-q` silences both forms. The log form prints one line each time at least
`ICLRKIT_PROGRESS_EVERY` seconds (default 10) have passed since the last one, and always one for the last item:

    progress blocks 3/12 elapsed 0:00:41 eta 0:02:03
"""

from __future__ import annotations

import os
import sys
import time
from typing import Iterable, Iterator, TypeVar

T = TypeVar("T")
DEFAULT_EVERY_S = 10.0


def _len_or_none(iterable) -> int | None:
    try:
        return len(iterable)
    except TypeError:
        return None


def _clock(seconds: float) -> str:
    seconds = int(round(max(seconds, 0.0)))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def _interval() -> float:
    raw = os.environ.get("ICLRKIT_PROGRESS_EVERY", "")
    try:
        return max(float(raw), 0.0) if raw else DEFAULT_EVERY_S
    except ValueError:
        return DEFAULT_EVERY_S


def stderr_is_tty() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def format_line(description: str, done: int, total: int | None, elapsed: float) -> str:
    """`progress WHAT i/n elapsed H:MM:SS eta H:MM:SS` (no n/eta when the length is unknown)."""
    what = description or "items"
    if total:
        eta = elapsed / done * (total - done) if done else 0.0
        return f"progress {what} {done}/{total} elapsed {_clock(elapsed)} eta {_clock(eta)}"
    return f"progress {what} {done} elapsed {_clock(elapsed)}"


def log_lines(iterable: Iterable[T], total: int | None, description: str, every_s: float | None = None,
              stream=None) -> Iterator[T]:
    """Yield the items; every `every_s` seconds and after the last item, write one progress line."""
    every_s = _interval() if every_s is None else every_s
    stream = stream or sys.stderr
    started = last = time.monotonic()
    done = 0
    for item in iterable:
        yield item
        done += 1
        now = time.monotonic()
        if now - last >= every_s or (total is not None and done == total):
            stream.write(format_line(description, done, total, now - started) + "\n")
            stream.flush()
            last = now


def rich_bar(iterable: Iterable[T], total: int | None, description: str) -> Iterator[T]:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(description, total=total)
        for item in iterable:
            yield item
            bar.advance(task)


def progress(iterable: Iterable[T], total: int | None = None, description: str = "",
             quiet: bool = False) -> Iterator[T]:
    """The one progress implementation: silent with -q, a bar on a TTY, log lines otherwise."""
    if quiet:
        yield from iterable
        return
    total = total if total is not None else _len_or_none(iterable)
    if stderr_is_tty():
        yield from rich_bar(iterable, total, description)
    else:
        yield from log_lines(iterable, total, description)
