"""Compiled kernels (`toolkit._C`, registered as torch.ops.iclrkit.*) with pure-torch references.

Importing never fails: without the extension every op runs its reference and `iclrkit info` says so.
"""

from __future__ import annotations

import importlib


def load_extension() -> tuple[bool, str]:
    """(built, detail). Importing torch first is required: the extension links against it."""
    import torch  # noqa: F401

    try:
        importlib.import_module("toolkit._C")
    except ImportError as exc:
        return False, f"toolkit._C not built ({exc}); pure-torch reference kernels in use"
    return True, "toolkit._C loaded"


def has_op(name: str) -> bool:
    import torch

    load_extension()
    return hasattr(torch.ops.iclrkit, name) if hasattr(torch.ops, "iclrkit") else False


def compiled_ops() -> list[str]:
    """Names of the ops `toolkit._C` registered under torch.ops.iclrkit."""
    import torch

    built, _ = load_extension()
    if not built:
        return []
    return sorted(name.split("::", 1)[1] for name in torch._C._dispatch_get_all_op_names()
                  if name.startswith("iclrkit::"))
