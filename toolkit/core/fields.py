"""Fields that many techniques share, declared once (help text, flag, short flag): `model: str = model_field()`.

The CLI builds each command's options from its config's fields (cli/_fields.py), so a knob shared by several
techniques is spelled and documented the same way everywhere."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

MODEL_HELP = "Model: local path, hub id, or zoo:NAME."
DATA_HELP = "Text: .txt, .jsonl[:field], 'embedded', or a hub dataset id."


def model_field(**extra: Any) -> Any:
    return Field(description=MODEL_HELP, json_schema_extra={"short": "-m"}, **extra)


def data_field(default: Any = None, description: str = DATA_HELP, **extra: Any) -> Any:
    return Field(default, description=description, json_schema_extra={"short": "-d"}, **extra)


def layers_field(description: str = "Block index (repeatable).", **extra: Any) -> Any:
    """`layers: Optional[list[BlockIndex]] = layers_field(...)`: --layer, repeatable."""
    return Field(None, description=description, json_schema_extra={"flag": "--layer"}, **extra)


ONLOAD_HELP = ("Read one decoder block at a time from a local safetensors directory instead of loading the whole "
               "model (memory: the parts outside the blocks + one block + activations).")


def onload_field(**extra: Any) -> Any:
    """`onload: bool = onload_field()`: per-block onloading (toolkit/models/lazy.py), `--set onload=true`."""
    return Field(False, description=ONLOAD_HELP, **extra)


# Bounds on the items of a list knob (`layers: list[BlockIndex]`); a scalar knob declares its own (Field(ge=...)).
# Every numeric knob a command offers declares its range: bounds (ge/gt/le/lt), a validator that refuses what is out
# of range, or `signed()` when zero and negative values all mean something (a steering strength). The CLI's
# bad-input matrix (tests/cli/test_bad_input_matrix.py) holds every registered command to this.
BlockIndex = Annotated[int, Field(ge=0)]  # a block (layer) index, 0-based from the first block
Count = Annotated[int, Field(ge=1)]


def signed(extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """json_schema_extra of a numeric knob whose every finite value means something, zero and negatives included
    (`alpha: float = Field(1.0, description=..., json_schema_extra=signed())`)."""
    return {**(extra or {}), "signed": True}
