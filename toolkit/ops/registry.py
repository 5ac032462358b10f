"""One op name per kernel, as torchao does: `torch.ops.iclrkit.<name>` dispatches on its tensors' device.

- `toolkit._C` defines the schemas and registers its kernels per dispatch key (csrc: `TORCH_LIBRARY_IMPL(iclrkit,
  CPU, m)`, and `TORCH_LIBRARY_IMPL(iclrkit, CUDA, m)` when built with CUDA).
- `register(...)` adds, for every op: the schema when `_C` is absent (so importing never fails), the pure-torch
  reference as the `CompositeExplicitAutograd` kernel (used only on a device that has no kernel of its own: a backend
  kernel always wins), and a fake (meta) implementation so shapes propagate on the meta device and under
  torch.compile.
- `has_kernel(name, "CUDA")` asks the dispatcher whether a compiled kernel (not the reference) serves that device.

Imports only torch, so kernels.py stays usable without the CLI's dependencies.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

import torch

NAMESPACE = "iclrkit"
_LIB: torch.library.Library | None = None
_REGISTERED: set[str] = set()


def load_extension() -> tuple[bool, str]:
    """(built, detail): imports `toolkit._C`, whose static initialisers register its schemas and kernels."""
    try:
        importlib.import_module("toolkit._C")
    except ImportError as exc:
        return False, f"toolkit._C not built ({exc}); pure-torch reference kernels in use"
    return True, "toolkit._C loaded"


def _library() -> torch.library.Library:
    global _LIB
    if _LIB is None:
        _LIB = torch.library.Library(NAMESPACE, "FRAGMENT")
    return _LIB


def qualified(name: str) -> str:
    return f"{NAMESPACE}::{name}"


def op_defined(name: str) -> bool:
    return qualified(name) in torch._C._dispatch_get_all_op_names()


def has_kernel(name: str, key: str) -> bool:
    """True when a kernel is registered for exactly this dispatch key ("CPU", "CUDA", "Meta"); the reference
    (CompositeExplicitAutograd) does not count."""
    return op_defined(name) and torch._C._dispatch_has_kernel_for_dispatch_key(qualified(name), key)


def register(name: str, schema: str, reference: Callable, fake: Callable) -> None:
    """Idempotent: the schema (if `_C` did not define it), the reference kernel and the fake implementation."""
    if name in _REGISTERED:
        return
    load_extension()
    lib = _library()
    if not op_defined(name):
        lib.define(schema)
    if not torch._C._dispatch_has_kernel_for_dispatch_key(qualified(name), "CompositeExplicitAutograd"):
        lib.impl(name, reference, "CompositeExplicitAutograd")
    if not torch._C._dispatch_has_kernel_for_dispatch_key(qualified(name), "Meta"):
        torch.library.register_fake(qualified(name), fake, lib=lib)
    _REGISTERED.add(name)


def op(name: str):
    return getattr(getattr(torch.ops, NAMESPACE), name)
