"""Typer commands generated from a technique's pydantic Config: each knob is declared once, on its field.

    class InfluenceConfig(BaseConfig):
        iterations: int = Field(2000, ge=1, description="UCT iterations per variable.")
        variables: list[str] | None = Field(None, description="...", json_schema_extra={"flag": "--variable"})

    config_command(app, "influence", config=InfluenceConfig, run="toolkit.causal.influence:run",
                   flags=["sem", "data", "variables", "iterations"], technique="causal.influence", help=..., epilog=...)

A field becomes `--field-name` (or its `flag`, plus `short`), typed as the field (Optional: None = not typed, so
the config layers below the flags win), with the field's description as help; Literal fields list their choices;
bool fields are `--x/--no-x` switches; dict fields are repeated KEY=VALUE; lists are
repeated flags, or one comma-separated value with `style: comma`. A field with no default is required by
the config (so --config/--set can supply it too) and says so in --help. The config class must live in a module that does not import torch (the CLI imports it to build --help);
`run` and `plan` are "module:function" strings imported only when the command runs.
"""

from __future__ import annotations

import importlib
import inspect
import types
import typing
from pathlib import Path
from typing import Annotated, Any, Callable, Literal, Optional, Union

import typer

from cli._options import (
    ConfigOpt,
    DeviceOpt,
    DryRunOpt,
    DtypeOpt,
    JsonOpt,
    OptionalOutOpt,
    OutOpt,
    OverwriteOpt,
    ResumeOpt,
    SeedOpt,
    SetOpt,
)

COMMON = {"out": OutOpt, "config": ConfigOpt, "set_": SetOpt, "seed": SeedOpt, "device": DeviceOpt,
          "dtype": DtypeOpt, "dry_run": DryRunOpt, "json_": JsonOpt, "overwrite": OverwriteOpt, "resume": ResumeOpt}
COMMON_DEFAULTS = {"dry_run": False, "json_": False, "overwrite": False, "resume": False}
STANDARD = ("out", "config", "set_", "seed", "device", "dry_run", "json_", "overwrite")


def _import(spec: str | Callable) -> Callable:
    if callable(spec):
        return spec
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def _unwrap_optional(annotation: Any) -> Any:
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


def _plain(item: Any) -> Any:
    """`Annotated[int, Field(ge=0)]` -> int (the bounds stay with the config, which checks them)."""
    return typing.get_args(item)[0] if typing.get_origin(item) is Annotated else item


def option_for(config_cls: type, name: str) -> tuple[Any, Callable[[Any], Any]]:
    """(Annotated type for Typer, converter from the typed value to the config value) for one field."""
    field = config_cls.model_fields[name]
    # a subclass that only changes a default (ObrConfig's a_bits = 4) keeps its base's help and flag
    declared = next((base.model_fields[name] for base in config_cls.__mro__
                     if name in getattr(base, "model_fields", {}) and base.model_fields[name].description), None)
    if declared is None:
        raise TypeError(f"{config_cls.__name__}.{name} needs a description to become a flag")
    extra = declared.json_schema_extra if isinstance(declared.json_schema_extra, dict) else {}
    flag = extra.get("flag", "--" + name.replace("_", "-"))
    decls = [flag] + ([extra["short"]] if extra.get("short") else [])
    help_text = field.description or declared.description
    if field.is_required():  # may come from --config/--set too, so the config (not Typer) enforces it
        help_text += " Required (here, in --config or by --set)."
    base = _unwrap_optional(field.annotation)
    origin = typing.get_origin(base)
    convert: Callable[[Any], Any] = lambda value: value  # noqa: E731
    if base is bool:
        stem = flag.removeprefix("--")
        decls = [f"--{stem}/--no-{stem}"] + decls[1:]
        kind: Any = Optional[bool]
    elif origin is Literal:
        choices = [str(c) for c in typing.get_args(base)]
        help_text = f"{help_text} One of: {' | '.join(choices)}."
        kind = Optional[str]
    elif origin in (list, tuple) and extra.get("style") == "comma":
        item = _plain((typing.get_args(base) or (str,))[0])
        if typing.get_origin(item) in (Union, types.UnionType):  # a number or a gradient: typed as the number
            item = _plain(next(a for a in map(_plain, typing.get_args(item)) if a in (int, float, str)))
        kind = Optional[str]
        help_text = f"{help_text} (comma-separated)"
        convert = _comma_list(flag, item)
    elif origin in (list, tuple):
        item = _plain((typing.get_args(base) or (str,))[0])
        kind = Optional[list[item if item in (str, int, float) else str]]
        convert = lambda value: list(value) if value else None  # noqa: E731
    elif origin is dict or base is dict:
        kind = Optional[list[str]]
        help_text = f"{help_text} (NAME=VALUE, repeatable)"
        convert = _key_values(flag)
    elif base in (int, float, str, Path):
        kind = Optional[base]
    else:
        kind = Optional[str]
    # --help renders rich markup: a literal "[" (E[kkᵀ]) must not open a tag
    return Annotated[kind, typer.Option(*decls, help=help_text.replace("[", "\\["))], convert


def _comma_list(flag: str, item: type) -> Callable[[Any], Any]:
    def convert(text):
        if text is None:
            return None
        from toolkit.core.errors import BadInputError

        try:
            return [item(v) for v in text.split(",") if v.strip()]
        except ValueError:
            kind = {int: "integers", float: "numbers"}.get(item, "values")
            raise BadInputError(f"{flag} expects comma-separated {kind}, got {text!r}") from None

    return convert


def _key_values(flag: str) -> Callable[[Any], Any]:
    def convert(items):
        if not items:
            return None
        from toolkit.core.errors import BadInputError

        parsed = {}
        for item in items:
            if "=" not in item:
                raise BadInputError(f"{flag} expects NAME=VALUE, got {item!r}")
            key, value = item.split("=", 1)
            parsed[key.strip()] = value.strip()
        return parsed

    return convert


def config_command(app: typer.Typer, name: str, *, config: type, run: str | Callable, technique: str, help: str,
                   epilog: str | None = None, flags: list[str] = (), common: tuple[str, ...] = STANDARD,
                   plan: str | Callable | None = None, inputs: Callable[[dict], dict] | None = None,
                   needs_out: bool = True, optional_out: bool = False, fixed: dict[str, Any] | None = None,
                   execute_with: Callable | None = None) -> Callable:
    """Register `name` on `app`: its options come from `flags` (field names of `config`) plus the common ones;
    `fixed` config values are set by the command itself (e.g. the estimator a subcommand stands for);
    `execute_with` replaces cli._runner.execute (same keywords), e.g. to translate a foreign --config first."""
    params, converters = [], {}
    for field_name in flags:
        annotation, convert = option_for(config, field_name)
        params.append(inspect.Parameter(field_name, inspect.Parameter.KEYWORD_ONLY, default=None,
                                        annotation=annotation))
        converters[field_name] = convert
    for option in common:
        annotation = OptionalOutOpt if option == "out" and optional_out else COMMON[option]
        params.append(inspect.Parameter(option, inspect.Parameter.KEYWORD_ONLY,
                                        default=COMMON_DEFAULTS.get(option), annotation=annotation))

    def command(**values: Any) -> None:
        from cli._runner import Common, execute, fail

        try:
            typed = {**(fixed or {}), **{k: converters[k](values[k]) for k in converters}}
        except Exception as exc:  # noqa: BLE001 - a bad flag value is reported like every other bad input
            fail(exc)
        (execute_with or execute)(
            technique=technique, config_cls=config, flags=typed, common=Common.of(values), run=_import(run),
            inputs=inputs(typed) if inputs else None, plan=_import(plan) if plan else None, needs_out=needs_out)

    # what the command is made of, for tools that walk the CLI (the bad-input matrix in tests/cli)
    command.iclrkit_spec = {"config": config, "flags": list(flags), "technique": technique, "common": tuple(common),
                            "needs_out": needs_out, "optional_out": optional_out, "fixed": dict(fixed or {})}
    command.__name__ = name.replace("-", "_")
    command.__doc__ = help
    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in params}
    app.command(name, help=help, epilog=epilog)(command)
    return command
