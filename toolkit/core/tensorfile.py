"""Tensors plus string metadata in one safetensors file: the format of every small artefact a run hands to a later
run (steering directions, edit values). Reading turns any unreadable file into one BadInputError line."""

from __future__ import annotations

from pathlib import Path

import torch

from toolkit.core.errors import BadInputError, require


def save_tensors(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> None:
    from safetensors.torch import save_file

    save_file({name: t.detach().float().cpu().contiguous() for name, t in tensors.items()}, str(path),
              metadata=metadata)


def load_tensors(path: Path, what: str, hint: str | None = None) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """(tensors, metadata) of a file written by save_tensors; `what` names the file's kind in errors."""
    from safetensors import safe_open

    require(path.is_file(), f"{what} not found: {path}", hint)
    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = dict(handle.metadata() or {})
            tensors = {key: handle.get_tensor(key) for key in handle.keys()}  # noqa: SIM118 - safe_open is not a dict
    except Exception as exc:  # noqa: BLE001 - any unreadable file is the user's input problem
        raise BadInputError(f"cannot read {what} from {path}: {exc}", hint) from None
    return tensors, metadata
