"""Run context: device, dtype, seed, atomic output directory, logging and progress (all on stderr)."""

from __future__ import annotations

import logging
import os
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path

from toolkit.core.errors import BadInputError, ResourceError
from toolkit.core.outdir import (  # noqa: F401 - --out lives in outdir; imported from here by older code
    CHECKPOINTS,
    atomic_dir,
    check_out_dir,
    input_location,
    is_iclrkit_output,
    normalize_modes,
    partial_dir_for,
    protected_dirs,
    remove_temporaries,
)

log = logging.getLogger("iclrkit")
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
