"""Shared Annotated options so every command spells the common flags the same way (DESIGN §3)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

DataOpt = Annotated[Optional[str], typer.Option("--data", "-d", help="Text: .txt, .jsonl[:field], 'embedded', or a hub dataset id.")]
OutOpt = Annotated[Optional[Path], typer.Option("--out", "-o", help="Output directory, written atomically: required "
                                                                    "to run (not with --dry-run).")]
# For the commands that print their result and write --out only when given (eval ppl, analyses, benchmarks).
OptionalOutOpt = Annotated[Optional[Path], typer.Option("--out", "-o", help="Output directory for run.json and the "
                                                                            "outputs (optional).")]
ConfigOpt = Annotated[Optional[Path], typer.Option("--config", help="YAML file with config keys.")]
SetOpt = Annotated[Optional[list[str]], typer.Option("--set", help="Override a config key: key=value (repeatable).")]
# torch.manual_seed takes [-2**63, 2**64): a seed outside is refused by the option itself (one line, exit 2). A
# callback rather than min/max keeps the 20-digit bounds out of every command's --help.
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1


def check_seed(value: Optional[int]) -> Optional[int]:
    if value is not None and not SEED_MIN <= value <= SEED_MAX:
        raise typer.BadParameter(f"{value} is outside the seeds torch takes, -2**63 to 2**64-1")
    return value


check_seed.iclrkit_range = (SEED_MIN, SEED_MAX)  # the range it enforces, for tools that walk the CLI
SeedOpt = Annotated[Optional[int], typer.Option("--seed", callback=check_seed,
                                                help="Random seed (default: the root --seed, else 0).")]
DeviceOpt = Annotated[Optional[str], typer.Option("--device", help="auto | cpu | cuda[:N] (default: the root --device).")]
DtypeOpt = Annotated[Optional[str], typer.Option("--dtype", help="float32 | float16 | bfloat16.")]
DryRunOpt = Annotated[bool, typer.Option("--dry-run", help="Resolve everything, print the plan, exit 0.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print run.json to stdout.")]
OverwriteOpt = Annotated[bool, typer.Option("--overwrite", help="Replace an earlier run's --out (a directory with "
                                                                "run.json); other directories also need --force.")]
ResumeOpt = Annotated[bool, typer.Option("--resume", help="Continue a killed run from OUT.partial checkpoints.")]
