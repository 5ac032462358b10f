"""Fields that many techniques share, declared once (help text, flag, short flag): `model: str = model_field()`.

The CLI builds each command's options from its config's fields (cli/_fields.py), so a knob shared by several
techniques is spelled and documented the same way everywhere."""

from __future__ import annotations

from typing import Any

from pydantic import Field

MODEL_HELP = "Model: local path, hub id, or zoo:NAME."
DATA_HELP = "Text: .txt, .jsonl[:field], 'embedded', or a hub dataset id."


def model_field(**extra: Any) -> Any:
    return Field(description=MODEL_HELP, json_schema_extra={"short": "-m"}, **extra)


def data_field(default: Any = None, description: str = DATA_HELP, **extra: Any) -> Any:
    return Field(default, description=description, json_schema_extra={"short": "-d"}, **extra)


def layers_field(description: str = "Block index (repeatable).", **extra: Any) -> Any:
    return Field(None, description=description, json_schema_extra={"flag": "--layer"}, **extra)


ONLOAD_HELP = ("Read one decoder block at a time from a local safetensors directory instead of loading the whole "
               "model (memory: the parts outside the blocks + one block + activations).")


def onload_field(**extra: Any) -> Any:
    """`onload: bool = onload_field()`: per-block onloading (toolkit/models/lazy.py), `--set onload=true`."""
    return Field(False, description=ONLOAD_HELP, **extra)
