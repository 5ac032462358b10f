"""Errors with exit codes: bad input 2, resource unavailable 3, run failed 1 (DESIGN §5)."""

from __future__ import annotations


class IclrkitError(Exception):
    exit_code = 1

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def one_line(self) -> str:
        return f"error: {self.message}" + (f" (hint: {self.hint})" if self.hint else "")


class BadInputError(IclrkitError):
    """Usage, configuration or data the user gave is wrong."""

    exit_code = 2


class ResourceError(IclrkitError):
    """Something needed is not available here: a device, a cached model, a compiled kernel."""

    exit_code = 3


class RunError(IclrkitError):
    """The computation itself failed (divergence, NaN, solver failure)."""

    exit_code = 1


def require(condition: bool, message: str, hint: str | None = None) -> None:
    if not condition:
        raise BadInputError(message, hint)
