"""Hook context managers over module paths; hooks are always removed, even when the body raises."""

from __future__ import annotations

import contextlib
from collections import defaultdict
from typing import Callable, Iterator

import torch.nn as nn

from toolkit.core.errors import BadInputError


class StopForward(Exception):
    """Raised by a forward hook to end a forward early (calibration and statistics need only the first blocks)."""


def stop_forward(module, args, output) -> None:
    """A forward hook that ends the forward right after `module`."""
    raise StopForward


def module_at(model: nn.Module, path: str) -> nn.Module:
    try:
        return model.get_submodule(path) if path else model
    except AttributeError:
        raise BadInputError(f"model has no module '{path}'") from None


def _first_tensor(value):
    return value[0] if isinstance(value, (tuple, list)) else value


@contextlib.contextmanager
def capture(model: nn.Module, paths: list[str], what: str = "output", detach: bool = True,
            to_cpu: bool = False, reduce: Callable | None = None) -> Iterator[dict[str, list]]:
    """Record each module's input (first positional arg) or output tensor on every forward, keyed by path: a list
    of them, or with `reduce` one running value, records[path] = reduce(previous or None, tensor) (statistics over
    many forwards without holding their activations)."""
    if what not in ("input", "output"):
        raise ValueError(what)
    records: dict = {} if reduce is not None else defaultdict(list)
    handles = []

    def make(path: str):
        def hook(module, args, output):
            value = _first_tensor(args if what == "input" else output)
            value = value.detach() if detach else value
            value = value.cpu() if to_cpu else value
            if reduce is not None:
                records[path] = reduce(records.get(path), value)
            else:
                records[path].append(value)
        return hook

    try:
        for path in paths:
            handles.append(module_at(model, path).register_forward_hook(make(path)))
        yield records
    finally:
        for handle in handles:
            handle.remove()


@contextlib.contextmanager
def edit_output(model: nn.Module, path: str, fn: Callable) -> Iterator[None]:
    """Replace a module's output by fn(output) (the first element when the module returns a tuple)."""
    def hook(module, args, output):
        if isinstance(output, tuple):
            return (fn(output[0]),) + tuple(output[1:])
        return fn(output)

    handle = module_at(model, path).register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()
