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


def _chain(exc: BaseException):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def is_disk_full(exc: BaseException) -> bool:
    """ENOSPC/EDQUOT anywhere in the chain, including torch.save's `inline_container.cc` write failures."""
    import errno

    for item in _chain(exc):
        if isinstance(item, OSError) and item.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        text = str(item)
        if "No space left on device" in text or "Disk quota exceeded" in text:
            return True
        if "inline_container.cc" in text and ("unexpected pos" in text or "write" in text.lower()):
            return True
    return False


def translate(exc: BaseException) -> BaseException:
    """Known environment failures as IclrkitErrors (one line, the right code); anything else unchanged."""
    if isinstance(exc, IclrkitError):
        return exc
    if is_disk_full(exc):
        return ResourceError("no space left on device while writing the run's files; partial files removed",
                             "free disk space or choose an --out on another disk")
    return exc
