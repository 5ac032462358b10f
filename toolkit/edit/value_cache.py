"""Saved value targets (δ, h, NLL) of an editing run, so the insertion can be redone without the value stage.

The value optimisation is nearly all of an edit's cost; the insertion (λ, C) is cheap. Reusing the δ of a run
makes a λ sweep cost one insertion and one evaluation per point (the official MEMIT's `--use_cache` does the same).
δ only stays valid for the same model weights, facts, context templates and edit layers, so all four are
checked.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch

from toolkit.core.errors import BadInputError
from toolkit.core.tensorfile import load_tensors, save_tensors
from toolkit.edit.facts import EditRequest

FILE_NAME = "values.safetensors"
_TENSORS = ("delta", "h", "nll", "keys_z")


def facts_digest(requests: list[EditRequest]) -> str:
    digest = hashlib.sha256()
    for request in requests:
        digest.update(json.dumps([request.record_id, request.prompt, request.subject, request.target_new]).encode())
    return digest.hexdigest()[:16]


def save_values(path: Path, tensors: dict[str, torch.Tensor], identity: dict) -> None:
    save_tensors(path, {name: tensors[name] for name in _TENSORS}, {"identity": json.dumps(identity, sort_keys=True)})


def load_values(path: str, identity: dict) -> dict[str, torch.Tensor]:
    """The tensors saved by an earlier run whose identity (model, facts, templates, layers) equals this one's."""
    file = Path(path).expanduser()
    if file.is_dir():
        file = file / FILE_NAME
    tensors, metadata = load_tensors(file, "values file", f"pass the {FILE_NAME} of an earlier edit run")
    missing = [name for name in _TENSORS if name not in tensors]
    if missing or "identity" not in metadata:
        raise BadInputError(f"{file}: not a values file of an edit run (missing {', '.join(missing) or 'identity'})")
    saved = json.loads(metadata["identity"])
    differing = sorted(key for key in identity if saved.get(key) != identity[key])
    if differing:
        raise BadInputError(f"{file} was computed for another {', '.join(differing)} than this run's",
                            "reuse values only with the same model, facts, context templates and edit layers")
    return tensors
