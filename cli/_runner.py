"""The one path every command takes: config -> context -> run -> run.json -> summary; errors -> one line + code."""

from __future__ import annotations

import datetime as dt
import json
import os
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import typer

ROOT_STATE: dict[str, Any] = {"device": None, "seed": None, "verbosity": 0, "offline": False}


@dataclass
class Common:
    """The flags every running command shares; a command builds it with `Common.of(locals())`."""

    out: Optional[Path] = None
    config: Optional[Path] = None
    set: Optional[list[str]] = None
    seed: Optional[int] = None
    device: Optional[str] = None
    dtype: Optional[str] = None
    dry_run: bool = False
    json: bool = False
    overwrite: bool = False
    resume: bool = False
    extra_inputs: dict = field(default_factory=dict)

    @classmethod
    def of(cls, values: dict[str, Any], **overrides: Any) -> "Common":
        """From a command's parameters (`set_`/`json_` are how Typer commands name --set/--json); absent ones keep
        their defaults, and `overrides` win (e.g. device="cpu" for a CPU-only command)."""
        names = {"out": "out", "config": "config", "set": "set_", "seed": "seed", "device": "device",
                 "dtype": "dtype", "dry_run": "dry_run", "json": "json_", "overwrite": "overwrite", "resume": "resume"}
        picked = {field_name: values[local] for field_name, local in names.items() if local in values}
        return cls(**{**picked, **overrides})


def fail(exc: BaseException) -> None:
    from toolkit.core.errors import IclrkitError

    debug = ROOT_STATE["verbosity"] >= 2 or os.environ.get("ICLRKIT_DEBUG") == "1"
    if debug:
        traceback.print_exception(exc, file=sys.stderr)
    if isinstance(exc, IclrkitError):
        typer.echo(exc.one_line(), err=True)
        raise typer.Exit(exc.exit_code)
    if isinstance(exc, KeyboardInterrupt):
        typer.echo("error: interrupted", err=True)
        raise typer.Exit(130)
    typer.echo(f"error: run failed: {type(exc).__name__}: {exc}" + ("" if debug else " (rerun with -vv for the traceback)"),
               err=True)
    raise typer.Exit(1)


def print_summary(record: dict, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(record, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{record['technique']} ({record['status']}, {record['duration_s']:.1f}s)", min_width=40)
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in _flatten(record.get("metrics", {})).items():
        table.add_row(key, f"{value:.4g}" if isinstance(value, float) else str(value))
    for key, value in _flatten(record.get("baselines", {})).items():
        table.add_row(f"baseline.{key}", f"{value:.4g}" if isinstance(value, float) else str(value))
    Console(file=sys.stdout, width=120).print(table)


def _flatten(data: dict, prefix: str = "") -> dict:
    flat: dict = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, name + "."))
        elif not isinstance(value, list):
            flat[name] = value
    return flat


def execute(
    *,
    technique: str,
    config_cls: type,
    flags: dict[str, Any],
    common: Common,
    run: Callable[[Any, Any], Any],
    inputs: dict[str, Any] | None = None,
    plan: Callable[[Any, Any], dict] | None = None,
    needs_out: bool = True,
) -> None:
    """Run one technique. `flags` are the command-specific values the user typed (None = not typed);
    `inputs` maps a name to each input path (checked against --out); `plan` returns the --dry-run plan."""
    try:
        _execute(technique, config_cls, flags, common, run, inputs or {}, plan, needs_out)
    except typer.Exit:
        raise
    except BaseException as exc:  # noqa: BLE001 - every failure becomes one line and an exit code
        fail(exc)


def _process_rank() -> int:
    """Rank under torchrun / `accelerate launch` (0 for a plain run)."""
    return int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")) or 0)


def _run_without_out(run, config, ctx, scratch: bool) -> None:
    """Run with no output directory, or, for ranks > 0, with a private scratch directory that is thrown away."""
    import tempfile

    if not scratch:
        run(config, ctx)
        return
    with tempfile.TemporaryDirectory(prefix=f"iclrkit-rank{_process_rank()}-") as private:
        ctx.out = Path(private)
        run(config, ctx)


def _path_flags(flags: dict[str, Any]) -> dict[str, Any]:
    """Model and data flags are inputs: recorded with hashes in run.json and protected from --out."""
    return {key: flags[key] for key in ("model", "data") if isinstance(flags.get(key), (str, Path))}


def _execute(technique, config_cls, flags, common, run, inputs, plan, needs_out) -> None:
    from toolkit.core.config import resolve_config
    from toolkit.core.context import RunContext, atomic_dir, check_out_dir, resolve_device, seed_everything
    from toolkit.core.errors import BadInputError
    from toolkit.core.report import build_run_record, write_run_files

    config = resolve_config(config_cls, common.config, common.set, flags)
    seed = common.seed if common.seed is not None else (ROOT_STATE["seed"] or 0)
    device = resolve_device(common.device or ROOT_STATE["device"])
    ctx = RunContext(device=device, dtype=common.dtype, seed=seed, dry_run=common.dry_run,
                     quiet=ROOT_STATE["verbosity"] < 0, resume=common.resume,
                     inputs={k: v for k, v in {**_path_flags(flags), **inputs, **common.extra_inputs}.items()
                             if v is not None})
    ctx.torch_dtype  # validates --dtype before any work
    command = "iclrkit " + " ".join(sys.argv[1:])
    if common.dry_run:
        details = plan(config, ctx) if plan else {}
        typer.echo(json.dumps({"technique": technique, "config": config.model_dump(mode="json"), "device": device,
                               "seed": seed, "out": str(common.out) if common.out else None, "plan": details},
                              indent=2, default=str))
        return
    if needs_out and common.out is None:
        raise BadInputError("--out DIR is required")
    if common.out is not None:
        check_out_dir(common.out, common.overwrite, [v for v in ctx.inputs.values() if isinstance(v, (str, Path))])
    seed_everything(seed)
    started, clock = dt.datetime.now(dt.timezone.utc), time.perf_counter()
    if common.out is None or _process_rank() > 0:
        _run_without_out(run, config, ctx, scratch=common.out is not None)
        if common.out is not None:
            return  # a non-zero rank of a multi-process launch: rank 0 writes --out and prints
        record = build_run_record(command=command, technique=technique, config=config.model_dump(mode="json"),
                                  ctx=ctx, started=started, duration_s=time.perf_counter() - clock, status="ok")
    else:
        with atomic_dir(common.out, overwrite=common.overwrite, resume=common.resume) as partial:
            ctx.out = partial
            run(config, ctx)
            record = build_run_record(command=command, technique=technique, config=config.model_dump(mode="json"),
                                      ctx=ctx, started=started, duration_s=time.perf_counter() - clock, status="ok")
            write_run_files(partial, record)
    print_summary(record, common.json)
