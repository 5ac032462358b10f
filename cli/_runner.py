"""The one path every command takes: config -> context -> run -> run.json -> summary; errors -> one line + code."""

from __future__ import annotations

import contextlib
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

from cli._ranks import check_ranks, owns_process_group, process_group, process_rank, rank_device

ROOT_STATE: dict[str, Any] = {"device": None, "seed": None, "verbosity": 0, "offline": False, "threads": None,
                              "force": False}
# Inputs that are configuration files (a mergekit YAML, a compress recipe): --out may not be them, but may sit beside them, as
# `mergekit-yaml config.yml ./out` does; model and data inputs protect their whole folder.
CONFIG_INPUTS = ("mergekit_config", "recipe")
# Techniques whose config key `threads` is torch's thread count (a benchmark's variable); the runner applies it.
CONFIG_THREADS = ("segment.mbunet.bench", "study.cot")


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
    force: bool = False
    resume: bool = False
    extra_inputs: dict = field(default_factory=dict)

    @classmethod
    def of(cls, values: dict[str, Any], **overrides: Any) -> "Common":
        """From a command's parameters (`set_`/`json_` are how Typer commands name --set/--json); absent ones keep
        their defaults, and `overrides` win (e.g. device="cpu" for a CPU-only command)."""
        names = {"out": "out", "config": "config", "set": "set_", "seed": "seed", "device": "device",
                 "dtype": "dtype", "dry_run": "dry_run", "json": "json_", "overwrite": "overwrite", "force": "force",
                 "resume": "resume"}
        picked = {field_name: values[local] for field_name, local in names.items() if local in values}
        return cls(**{**picked, **overrides})


class Terminated(KeyboardInterrupt):
    """SIGTERM, handled like Ctrl-C: the same cleanup of OUT.partial, one line, exit 143."""


def fail(exc: BaseException) -> None:
    """Every failure as one line on stderr and its exit code; what a failed run left in OUT.partial (kept for
    --resume, or removed) is said in that same line."""
    from toolkit.core.errors import IclrkitError, translate

    debug = ROOT_STATE["verbosity"] >= 2 or os.environ.get("ICLRKIT_DEBUG") == "1"
    if debug:
        traceback.print_exception(exc, file=sys.stderr)
    exc = translate(exc)
    partial = getattr(exc, "iclrkit_partial", None)

    def said(text: str, resumable: bool = True, say_removed: bool = False) -> str:
        note = partial.note(resumable, say_removed) if partial is not None else ""
        return f"{text}; {note}" if note else text

    if isinstance(exc, IclrkitError):
        hint = f" (hint: {exc.hint})" if exc.hint else ""
        message = said(exc.message, exc.exit_code != 2, getattr(exc, "say_removed", False))
        typer.echo(f"error: {message}{hint}", err=True)
        raise typer.Exit(exc.exit_code)
    if isinstance(exc, Terminated):
        typer.echo(f"error: {said('terminated (SIGTERM)')}", err=True)
        raise typer.Exit(143)
    if isinstance(exc, KeyboardInterrupt):
        typer.echo(f"error: {said('interrupted')}", err=True)
        raise typer.Exit(130)
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    typer.echo(f"error: {said(f'run failed: {type(exc).__name__}: {first}')}"
               + ("" if debug else " (rerun with -vv for the traceback)"), err=True)
    raise typer.Exit(1)


@contextlib.contextmanager
def failing_in_one_line():
    """For commands outside `execute` (zoo build): SIGTERM handled like Ctrl-C, every failure one line + code."""
    try:
        with _sigterm_as_interrupt():
            yield
    except typer.Exit:
        raise
    except BaseException as exc:  # noqa: BLE001
        fail(exc)


def parse_threads(value: Any, source: str) -> int | None:
    """A positive thread count, or None (torch's default); 0, negatives and non-integers are bad input."""
    from toolkit.core.errors import BadInputError

    if value is None or value == "":
        return None
    try:
        threads = int(value)
    except (TypeError, ValueError):
        raise BadInputError(f"{source} must be a positive integer, got {value!r}") from None
    if threads < 1:
        raise BadInputError(f"{source} must be at least 1, got {threads}", "omit it to use torch's default")
    return threads


def requested_threads() -> int | None:
    """--threads, else ICLRKIT_THREADS, else None (torch's default: one thread per core)."""
    if ROOT_STATE.get("threads") is not None:
        return parse_threads(ROOT_STATE["threads"], "--threads")
    return parse_threads(os.environ.get("ICLRKIT_THREADS"), "ICLRKIT_THREADS")


def apply_threads(command_threads: int | None = None) -> int | None:
    """The process's one thread policy: intra-op threads (and inter-op ones while torch still allows it).

    A command whose config carries `threads` (a benchmark's own --threads, `--set threads=N`) gets that count;
    otherwise the root --threads, else ICLRKIT_THREADS, else torch's default."""
    threads = parse_threads(command_threads, "threads") if command_threads is not None else requested_threads()
    if threads is None:
        return None
    import torch

    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(threads)
    except RuntimeError:  # only settable before the first inter-op parallel work; intra-op is what matters here
        pass
    return threads


MMAP_THRESHOLD = 1 << 20  # bytes: allocations from here up get their own mapping, returned to the OS when freed


def apply_allocator(onload: bool) -> bool:
    """The allocator policy of an onloaded run (glibc only): blocks of 1 MiB and more are mmapped. With glibc's
    adaptive threshold the large tensors a layer pipeline frees and re-allocates block after block fragment the heap,
    and the resident memory of an onloaded 360M-shape compress crept up ~40 MB per block (1.57 GB at 12 blocks; flat
    at 0.94 GB with this, for 2.5% more CPU time). Only for `onload` runs: elsewhere every freed block would be
    unmapped and page-faulted afresh (TokUR scoring: ~3 M minor faults, 7 s of system time per GSM8K question).
    MALLOC_MMAP_THRESHOLD_ in the environment wins. True if applied."""
    import ctypes
    import os
    import sys

    if not onload or not sys.platform.startswith("linux") or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(-3, MMAP_THRESHOLD))  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):  # not glibc (musl, ...): its own allocator, nothing to set
        return False


def print_summary(record: dict, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(record, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    verdict = f": {record['verdict']}" if record.get("verdict") else ""
    table = Table(title=f"{record['technique']} ({record['status']}{verdict}, {record['duration_s']:.1f}s)",
                  min_width=40)
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
    multi_rank: bool | None = None,
) -> None:
    """Run one technique. `flags` are the command-specific values the user typed (None = not typed);
    `inputs` maps a name to each input path (checked against --out); `plan` returns the --dry-run plan;
    `multi_rank` says whether run() shares its work across torchrun ranks (default: the MULTI_RANK table)."""
    try:
        with _sigterm_as_interrupt():
            try:
                _execute(technique, config_cls, flags, common, run, inputs or {}, plan, needs_out, multi_rank)
            except UnicodeDecodeError as exc:
                raise _not_text(exc, {**_path_flags(flags), **(inputs or {})}) from None
    except typer.Exit:
        raise
    except BaseException as exc:  # noqa: BLE001 - every failure becomes one line and an exit code
        fail(exc)


@contextlib.contextmanager
def _sigterm_as_interrupt():
    """SIGTERM raises Terminated (a KeyboardInterrupt) so atomic_dir cleans up as it does for Ctrl-C."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):  # noqa: ARG001
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run_without_out(run, config, ctx, scratch: bool) -> None:
    """Run with no output directory, or, for ranks > 0, with a private scratch directory that is thrown away."""
    import tempfile

    if not scratch:
        run(config, ctx)
        return
    with tempfile.TemporaryDirectory(prefix=f"iclrkit-rank{process_rank()}-") as private:
        ctx.out = Path(private)
        run(config, ctx)


def _not_text(exc: UnicodeDecodeError, inputs: dict[str, Any]):
    """A binary (or non-UTF-8) file where text was expected: bad input naming the file inputs, exit 2."""
    from toolkit.core.errors import BadInputError

    files = [f"--{k} {v}" for k, v in inputs.items() if isinstance(v, (str, Path)) and Path(v).is_file()]
    where = f" ({', '.join(files)})" if files else ""
    return BadInputError(f"an input file is not UTF-8 text{where}: {exc.reason} at byte {exc.start}",
                         "pass a text file (.csv/.txt/.jsonl) or the binary format the command accepts")


def _path_flags(flags: dict[str, Any]) -> dict[str, Any]:
    """Model and data flags are inputs: recorded with hashes in run.json and protected from --out."""
    return {key: flags[key] for key in ("model", "data") if isinstance(flags.get(key), (str, Path))}


def _execute(technique, config_cls, flags, common, run, inputs, plan, needs_out, multi_rank) -> None:
    from toolkit.core.config import flag_of, resolve_config
    from toolkit.core.context import RUN_WARNINGS, RunContext, resolve_device, seed_everything
    from toolkit.core.errors import BadInputError
    from toolkit.core.outdir import check_out_dir
    from toolkit.models.inputs import check_inputs, guarded_inputs

    RUN_WARNINGS.clear()
    config = resolve_config(config_cls, common.config, common.set, flags)
    if not common.dry_run:  # missing/corrupt inputs, before anything loads (a plan needs no model)
        check_inputs(config, lambda name: flag_of(config_cls, name) or name)
    check_ranks(technique, multi_rank)
    threads = apply_threads(getattr(config, "threads", None) if technique in CONFIG_THREADS else None)
    apply_allocator(bool(getattr(config, "onload", False)))  # configs without onloading have no such field
    seed = common.seed if common.seed is not None else (ROOT_STATE["seed"] or 0)
    device = rank_device(resolve_device(common.device or ROOT_STATE["device"]))
    ctx = RunContext(device=device, dtype=common.dtype, seed=seed, dry_run=common.dry_run,
                     quiet=ROOT_STATE["verbosity"] < 0, resume=common.resume,
                     inputs={k: v for k, v in {**_path_flags(flags), **inputs, **common.extra_inputs}.items()
                             if v is not None})
    ctx.torch_dtype  # validates --dtype before any work
    command = "iclrkit " + " ".join(sys.argv[1:])
    if common.dry_run:
        details = plan(config, ctx) if plan else {}
        typer.echo(json.dumps({"technique": technique, "config": config.model_dump(mode="json"), "device": device,
                               "seed": seed, "threads": threads, "out": str(common.out) if common.out else None,
                               "plan": details}, indent=2, default=str))
        return
    if needs_out and common.out is None:
        raise BadInputError("--out DIR is required")
    if common.out is not None:
        guarded = [v for k, v in ctx.inputs.items() if isinstance(v, (str, Path)) and k not in CONFIG_INPUTS]
        check_out_dir(common.out, common.overwrite, guarded + guarded_inputs(config),
                      force=common.force or ROOT_STATE.get("force", False),
                      files=[v for k, v in ctx.inputs.items() if k in CONFIG_INPUTS and v])
    seed_everything(seed)
    with process_group(technique, device):
        _run_and_record(technique, config, common, run, ctx, command)


def _run_and_record(technique, config, common, run, ctx, command) -> None:
    from toolkit.core.outdir import atomic_dir
    from toolkit.core.report import build_run_record, git_sha, write_run_files

    started, clock = dt.datetime.now(dt.timezone.utc), time.perf_counter()
    git_sha()  # the commit this run starts from (cached: run.json records it, not the HEAD when the run ends)
    if common.out is None or process_rank() > 0:
        # ranks > 0 of a PROCESS_GROUP technique know they write nothing; other multi-rank ones get a scratch --out
        scratch = common.out is not None and process_rank() > 0 and not owns_process_group(technique)
        _run_without_out(run, config, ctx, scratch=scratch)
        if process_rank() > 0:
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
