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
from toolkit.edit.facts import EditRequest

FILE_NAME = "values.safetensors"
_TENSORS = ("delta", "h", "nll", "keys_z")


def facts_digest(requests: list[EditRequest]) -> str:
    digest = hashlib.sha256()
    for request in requests:
        digest.update(json.dumps([request.record_id, request.prompt, request.subject, request.target_new]).encode())
    return digest.hexdigest()[:16]


def save_values(path: Path, tensors: dict[str, torch.Tensor], identity: dict) -> None:
    from safetensors.torch import save_file

    save_file({name: tensors[name].detach().float().cpu().contiguous() for name in _TENSORS}, str(path),
              metadata={"identity": json.dumps(identity, sort_keys=True)})


def load_values(path: str, identity: dict) -> dict[str, torch.Tensor]:
    """The tensors saved by an earlier run whose identity (model, facts, templates, layer) equals this one's."""
    from safetensors import SafetensorError, safe_open

    file = Path(path).expanduser()
    if file.is_dir():
        file = file / FILE_NAME
    if not file.is_file():
        raise BadInputError(f"values file not found: {file}", f"pass the {FILE_NAME} of an earlier edit run")
    try:
        with safe_open(str(file), framework="pt") as handle:
            saved = json.loads((handle.metadata() or {}).get("identity", "{}"))
            tensors = {name: handle.get_tensor(name) for name in _TENSORS}
    except (SafetensorError, json.JSONDecodeError, OSError) as error:
        raise BadInputError(f"{file}: not a values file of an edit run ({error})") from None
    except Exception as error:  # a missing tensor name; safetensors raises a plain exception type for it
        raise BadInputError(f"{file}: incomplete values file ({error})") from None
    differing = sorted(key for key in identity if saved.get(key) != identity[key])
    if differing:
        raise BadInputError(f"{file} was computed for another {', '.join(differing)} than this run's",
                            "reuse values only with the same model, facts, context templates and edit layers")
    return tensors
