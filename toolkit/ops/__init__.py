"""Compiled kernels (`toolkit._C`, registered as torch.ops.iclrkit.*) with pure-torch references.

Each kernel is one op name whose CPU and CUDA kernels are registered per dispatch key (toolkit.ops.registry);
importing never fails: without the extension every op runs its reference and `iclrkit info` says so.
"""

from __future__ import annotations


def load_extension() -> tuple[bool, str]:
    """(built, detail). Importing torch first is required: the extension links against it."""
    from toolkit.ops.registry import load_extension as load

    return load()


def has_op(name: str, device: str | None = None) -> bool:
    """True when `toolkit._C` registered a compiled kernel for op `name`: for `device` ("cpu", "cuda") when given,
    else for any device. The pure-torch references (CompositeExplicitAutograd) do not count."""
    from toolkit.ops.registry import has_kernel

    load_extension()
    keys = [device.upper()] if device else ["CPU", "CUDA"]
    return any(has_kernel(name, key) for key in keys)


def compiled_ops() -> list[str]:
    """Names of the ops with a compiled kernel (CPU or CUDA) in `toolkit._C`; `compiled_devices` says which."""
    import torch

    built, _ = load_extension()
    if not built:
        return []
    out = []
    for full in sorted(torch._C._dispatch_get_all_op_names()):
        if not full.startswith("iclrkit::"):
            continue
        name = full.split("::", 1)[1]
        if compiled_devices(name):
            out.append(name)
    return out


def compiled_devices(name: str) -> list[str]:
    """The dispatch keys ("CPU", "CUDA") that have a compiled kernel for op `name`."""
    from toolkit.ops.registry import has_kernel

    load_extension()
    return [key for key in ("CPU", "CUDA") if has_kernel(name, key)]
