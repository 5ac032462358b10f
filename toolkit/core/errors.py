"""Errors with exit codes: bad input 2, resource unavailable 3, run failed 1 (DESIGN §5)."""

from __future__ import annotations

import contextlib
from pathlib import Path


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


PICKLE_REFUSED = "holds a pickle that is not plain tensors; it was not loaded because it could run code"


def is_refused_pickle(exc: BaseException) -> bool:
    """torch.load(weights_only=True) refusing a pickle (its message advises weights_only=False: never repeat that)."""
    import pickle

    return any(isinstance(item, pickle.UnpicklingError) or "Weights only load failed" in str(item)
               for item in _chain(exc))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def corrupt_file(path: str | Path, exc: BaseException, what: str = "file", hint: str | None = None) -> BadInputError:
    """One line for a file that exists but cannot be read back: a refused pickle, or the reader's first line."""
    if is_refused_pickle(exc):
        return BadInputError(f"{what} {path} {PICKLE_REFUSED}", hint or "use a file from a trusted source")
    return BadInputError(f"corrupt {what} {path}: {_first_line(exc)}", hint)


RESUME_HINT = "start afresh: rerun without --resume (OUT.partial is replaced)"


@contextlib.contextmanager
def reading_checkpoint(path: str | Path):
    """`with reading_checkpoint(path): state = torch.load(path, ...)`: a truncated, garbled or hostile checkpoint
    found by --resume is bad input naming the file (exit 2) with the way out (a fresh run), never a raw reader error
    followed by advice to --resume again."""
    try:
        yield
    except IclrkitError:
        raise
    except MemoryError:
        raise
    except Exception as exc:  # noqa: BLE001 - every reader (json, safetensors, torch, accelerate) has its own types
        raise corrupt_file(path, exc, "checkpoint", RESUME_HINT) from None


def translate(exc: BaseException) -> BaseException:
    """Known environment failures as IclrkitErrors (one line, the right code); anything else unchanged. What a
    failed run left behind (`iclrkit_partial`, set by atomic_dir) travels with the translated error."""
    if isinstance(exc, IclrkitError):
        return exc
    mapped: IclrkitError | None = None
    if is_disk_full(exc):
        mapped = ResourceError("no space left on device while writing the run's files",
                               "free disk space or choose an --out on another disk")
        mapped.say_removed = True  # the line says what became of OUT.partial either way
    elif is_refused_pickle(exc):
        mapped = BadInputError(f"an input file {PICKLE_REFUSED}", "use safetensors files from a trusted source")
    if mapped is None:
        return exc
    if hasattr(exc, "iclrkit_partial"):
        mapped.iclrkit_partial = exc.iclrkit_partial
    return mapped
