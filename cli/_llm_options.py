"""--concurrency for the commands that can query an OpenAI-compatible server (rag deeprag, prompt mhlp)."""

from __future__ import annotations

import contextlib
from typing import Annotated, Optional

import typer

ConcurrencyOpt = Annotated[Optional[int], typer.Option(
    "--concurrency", help="Requests kept in flight to an OpenAI-compatible server (openai:...), results in input "
                          "order (default 1; local models ignore it).")]


@contextlib.contextmanager
def server_concurrency(value: int | None):
    """Set the concurrency of every server backend the command loads, for the command's duration; bad -> exit 2."""
    from cli._runner import fail
    from toolkit.core.errors import IclrkitError
    from toolkit.llm.load import SERVER_DEFAULTS, set_server_concurrency

    before = SERVER_DEFAULTS["concurrency"]
    if value is not None:
        try:
            set_server_concurrency(value)
        except IclrkitError as exc:
            fail(exc)
    try:
        yield
    finally:
        SERVER_DEFAULTS["concurrency"] = before
