"""Run context: device, dtype, seed, atomic output directory, logging and progress (all on stderr)."""

from __future__ import annotations

import contextlib
import logging
import os
import random
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

from toolkit.core.errors import BadInputError, ResourceError

log = logging.getLogger("iclrkit")
CHECKPOINTS = "checkpoints"
# Warnings of the current run (silent clamps, defaults chosen for the user): printed once, recorded in run.json.
RUN_WARNINGS: list[str] = []


def warn_and_record(message: str) -> None:
    """Library code without a RunContext: a warning on stderr that also lands in run.json's `warnings`."""
    if message in RUN_WARNINGS:
        return
    RUN_WARNINGS.append(message)
    log.warning("%s", message)


def setup_logging(verbosity: int) -> None:
    level = {-1: logging.ERROR, 0: logging.WARNING, 1: logging.INFO}.get(verbosity, logging.DEBUG)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname).1s %(message)s"))
    root = logging.getLogger("iclrkit")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error" if verbosity < 2 else "info")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def resolve_device(requested: str | None) -> str:
    """`auto` picks CUDA when present and says so; an explicit device that is not there fails fast (exit 3)."""
    import torch

    requested = (requested or "auto").lower()
    if requested == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
        log.info("device auto -> %s", device)
        return device
    if requested == "cpu":
        return "cpu"
    if requested.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ResourceError(f"--device {requested} asked for, but this torch sees no CUDA device",
                                "use --device cpu or --device auto")
        index = int(requested.split(":", 1)[1]) if ":" in requested else 0
        if index >= torch.cuda.device_count():
            raise ResourceError(f"--device {requested}: only {torch.cuda.device_count()} CUDA device(s) present")
        return requested
    if requested == "mps":
        if not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
            raise ResourceError("--device mps asked for, but MPS is not available")
        return "mps"
    raise BadInputError(f"unknown device '{requested}'", "use auto, cpu, cuda or cuda:N")


def resolve_dtype(name: str | None):
    import torch

    table = {None: torch.float32, "auto": torch.float32, "float32": torch.float32, "fp32": torch.float32,
             "float16": torch.float16, "fp16": torch.float16, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}
    if name not in table:
        raise BadInputError(f"unknown dtype '{name}'", "use float32, float16 or bfloat16")
    return table[name]


def seed_everything(seed: int) -> None:
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def protected_dirs() -> list[Path]:
    """Caches that --out must never point into: the zoo cache and the Hugging Face hub cache."""
    from toolkit.core.paths import zoo_dir

    dirs = [zoo_dir()]
    try:
        from huggingface_hub import constants

        dirs.append(Path(constants.HF_HUB_CACHE))
    except Exception:  # noqa: BLE001 - no huggingface_hub: nothing of it to protect
        pass
    return [d.expanduser().resolve() for d in dirs]


def input_location(item: str | Path) -> Path | None:
    """Where an input lives on disk: a path, zoo:NAME's cache directory, or a hub id's HF cache folder."""
    text = str(item)
    if text.startswith("zoo:"):
        from toolkit.core.paths import zoo_cached_path

        return zoo_cached_path(text[4:])
    path = Path(text).expanduser()
    if path.exists():
        return path
    parts = text.split("/")
    if 1 <= len(parts) <= 2 and all(parts) and not text.startswith((".", "~")):
        try:
            from huggingface_hub import constants

            return Path(constants.HF_HUB_CACHE) / ("models--" + "--".join(parts))
        except Exception:  # noqa: BLE001
            return None
    return None


def is_iclrkit_output(path: Path) -> bool:
    return (path / "run.json").is_file()


def check_out_dir(out: Path, overwrite: bool, inputs: Iterable[str | Path] = (), force: bool = False) -> None:
    """Refuse --out inside (or equal to) an input or a cache, a non-empty --out without --overwrite, and a non-empty
    directory that is not an iclrkit output (no run.json) unless --overwrite --force."""
    out = Path(out).expanduser().resolve()
    for cache in protected_dirs():
        if out == cache or cache in out.parents:
            raise BadInputError(f"--out {out} is inside the cache {cache}; outputs never go into a cache",
                                "choose a directory outside the cache")
    for item in inputs:
        path = input_location(item)
        if path is None:
            continue
        src = path.resolve()
        if out == src or src in out.parents:
            raise BadInputError(f"--out {out} is inside the input {item}; outputs never go into an input's directory")
        if out in src.parents:
            raise BadInputError(f"--out {out} contains the input {item}; choose another directory")
    if not out.exists() or (out.is_dir() and not any(out.iterdir())):
        return
    if not overwrite:
        raise BadInputError(f"--out {out} exists and is not empty", "pass --overwrite or choose another directory")
    if not (out.is_dir() and is_iclrkit_output(out)) and not force:
        raise BadInputError(f"--out {out} is not an iclrkit output (no run.json); --overwrite would delete it",
                            "pass --overwrite --force to replace it anyway, or choose another directory")


def partial_dir_for(out: Path) -> Path:
    out = Path(out).resolve()
    return out.parent / (out.name + ".partial")


TEMPORARY_SUFFIXES = (".tmp", ".partial", ".part")


def remove_temporaries(root: Path) -> None:
    """Delete half-written files (`*.tmp`, `*.partial`, `*.part`) under `root`: a failed or full-disk write."""
    for path in sorted(Path(root).rglob("*"), reverse=True):
        if path.suffix in TEMPORARY_SUFFIXES:
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)


def _has_checkpoint(partial: Path) -> bool:
    checkpoints = partial / CHECKPOINTS
    return checkpoints.is_dir() and any(p.is_file() for p in checkpoints.rglob("*"))


@contextlib.contextmanager
def atomic_dir(out: Path, overwrite: bool = False, resume: bool = False) -> Iterator[Path]:
    """Build in `OUT.partial`, rename onto OUT only when the block succeeds.

    Without --resume a stale `OUT.partial` is wiped first; with --resume it is reused. A failed run keeps it only
    when it holds checkpoints (so --resume can continue); nothing half-written ever appears at OUT.
    """
    out = Path(out).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = partial_dir_for(out)
    if partial.exists() and not resume:
        shutil.rmtree(partial)
    partial.mkdir(exist_ok=True)
    try:
        yield partial
    except BaseException:
        remove_temporaries(partial)
        if _has_checkpoint(partial):
            log.warning("partial results kept in %s; rerun the same command with --resume to continue", partial)
        else:
            shutil.rmtree(partial, ignore_errors=True)
        raise
    shutil.rmtree(partial / CHECKPOINTS, ignore_errors=True)
    if out.exists():
        if not overwrite:
            raise BadInputError(f"--out {out} appeared while running; results stay in {partial}")
        shutil.rmtree(out) if out.is_dir() else out.unlink()
    os.replace(partial, out)


@dataclass
class RunContext:
    """What a technique's run() receives: it never picks devices, seeds or writes files outside `out`."""

    device: str = "cpu"
    dtype: str | None = None
    seed: int = 0
    out: Path | None = None
    dry_run: bool = False
    quiet: bool = False
    resume: bool = False
    metrics: dict = field(default_factory=dict)
    baselines: dict = field(default_factory=dict)
    artifacts: list = field(default_factory=list)
    inputs: dict = field(default_factory=dict)
    caches: dict = field(default_factory=dict)
    # a run that completed but whose result failed its own check says so here (e.g. "edit did not take"): run.json
    # `verdict` and the summary's title; the exit code stays 0
    verdict: str | None = None

    def warn(self, message: str) -> None:
        """A warning on stderr that is also recorded in run.json (`warnings`): silent clamps, defaults chosen."""
        warn_and_record(message)

    @property
    def torch_dtype(self):
        return resolve_dtype(self.dtype)

    @property
    def checkpoint_dir(self) -> Path:
        target = self.path(CHECKPOINTS, record=False)
        target.mkdir(exist_ok=True)
        return target

    def path(self, name: str, record: bool = True) -> Path:
        if self.out is None:
            raise BadInputError("this command needs --out DIR to write its outputs")
        target = self.out / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if record and name not in self.artifacts:
            self.artifacts.append(name)
        return target

    def progress(self, iterable, total: int | None = None, description: str = ""):
        """Progress on stderr (a bar on a terminal, steady log lines otherwise), silent with -q."""
        from toolkit.core.progress import progress

        return progress(iterable, total=total, description=description, quiet=self.quiet)

    def record_cache(self, name: str, path: str | Path) -> None:
        """Name a cache this run read or wrote outside --out (recorded in run.json under `caches`)."""
        self.caches[name] = str(path)
