"""Typed configs. Precedence: defaults < --config YAML < --set key=value < flags the user typed."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from toolkit.core.errors import BadInputError

C = TypeVar("C", bound="BaseConfig")


class BaseConfig(BaseModel):
    """Unknown keys are refused, and so is every non-finite float (inf, -inf, NaN) in any field, list or mapping:
    no knob of the house means anything at infinity, and NaN compares false with every bound."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=(), allow_inf_nan=False)

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        """A subclass that redeclares a knob for a new default (`sparsity: float = 0.5`, or with its own help text)
        keeps the knob's declaration from the base that made it: its bounds (ge/gt/le/lt), and, when it gives none
        of its own, its description and flag. A new default never silently drops a range check."""
        super().__pydantic_init_subclass__(**kwargs)
        from pydantic.fields import FieldInfo

        own = cls.__dict__.get("__annotations__", {})
        changed = False
        for name, field in cls.model_fields.items():
            if name not in own or field.metadata:
                continue
            declared = next((base.model_fields[name] for base in cls.__mro__[1:]
                             if name in getattr(base, "model_fields", {})
                             and (base.model_fields[name].description or base.model_fields[name].metadata)), None)
            if declared is None:
                continue
            bare = not (field.description or field.json_schema_extra)
            if (declared.metadata and field.annotation == declared.annotation) or (bare and declared.description):
                cls.model_fields[name] = FieldInfo.merge_field_infos(declared, field)
                changed = True
        if changed:
            cls.model_rebuild(force=True)


def flag_of(cls: type, name: str) -> str | None:
    """The command-line flag of config field `name` (its `flag`, else --name-with-dashes), None for no such field."""
    field = getattr(cls, "model_fields", {}).get(name)
    if field is None:
        return None
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    return extra.get("flag", "--" + name.replace("_", "-"))


def load_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise BadInputError(f"config file not found: {path}")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise BadInputError(f"config {path} is not UTF-8 text") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise BadInputError(f"malformed YAML in {path}{where}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise BadInputError(f"config {path} must be a mapping of keys to values, got {type(data).__name__}")
    return data


def parse_set(items: list[str] | None) -> dict[str, Any]:
    """`--set a.b=3` -> {"a": {"b": 3}}; values are parsed as YAML scalars (or flow lists/mappings)."""
    out: dict[str, Any] = {}
    for item in items or []:
        if "=" not in item:
            raise BadInputError(f"--set expects key=value, got {item!r}")
        key, raw = item.split("=", 1)
        parts = key.strip().split(".")
        if not all(part.strip() for part in parts):
            raise BadInputError(f"--set {item!r}: empty key part", "write key=value or section.key=value")
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError:
            raise BadInputError(f"--set {key}: cannot parse the value {raw!r}",
                                "quote strings; lists look like [1, 2]") from None
        node = out
        for depth, part in enumerate(parts[:-1]):
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise BadInputError(f"--set {key}: '{'.'.join(parts[:depth + 1])}' is already set to a value")
        if isinstance(node.get(parts[-1]), dict) and not isinstance(value, dict):
            raise BadInputError(f"--set {key}: '{key}' already holds nested keys")
        node[parts[-1]] = value
    return out


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def resolve_config(
    cls: type[C],
    config_file: str | Path | None = None,
    sets: list[str] | None = None,
    flags: dict[str, Any] | None = None,
) -> C:
    """Build `cls` from the layers; `flags` holds only values the user typed (None means not typed)."""
    layers: dict[str, Any] = {}
    if config_file:
        layers = deep_merge(layers, load_yaml(config_file))
    layers = deep_merge(layers, parse_set(sets))
    layers = deep_merge(layers, {k: v for k, v in (flags or {}).items() if v is not None})
    try:
        return cls(**layers)
    except ValidationError as exc:
        errors = exc.errors()
        first = errors[0]
        loc = ".".join(str(p) for p in first["loc"]) or "config"
        if first["type"] == "extra_forbidden":
            known = ", ".join(sorted(cls.model_fields))
            raise BadInputError(f"unknown config key '{loc}'", f"known keys: {known}") from None
        top = str(first["loc"][0]) if first["loc"] else ""
        flag = flag_of(cls, top)
        named = f"'{loc}'" + (f" ({flag})" if flag and top in (flags or {}) and flags[top] is not None else "")
        shown = repr(first.get("input"))
        given = (f", got {shown if len(shown) <= 60 else shown[:57] + '...'}"
                 if first["type"] != "missing" and "input" in first and first["loc"] else "")
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        message = " ".join(str(first["msg"]).split())  # one line, whatever a validator wrote
        raise BadInputError(f"invalid config value for {named}: {message}{given}{more}") from None
