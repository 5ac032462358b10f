"""`iclrkit compress bench`: time the packed INT4 kernels (dense and 2:4) and a packed model against FP32.

Its options come from BenchConfig's fields (toolkit/compress/config.py), like every other command's."""

from __future__ import annotations

import typer

from cli._fields import config_command
from toolkit.compress.config import BenchConfig

HELP = "Benchmark the INT4 GEMM kernels (W4A8, dense and 2:4) and a packed OBR model against FP32."
EPILOG = ("Examples: iclrkit compress bench --out runs/bench | iclrkit compress bench --model runs/obr/packed "
          "--rows 1 --rows 32 --out runs/bench-model --json")


def register(app: typer.Typer) -> None:
    config_command(app, "bench", config=BenchConfig, run="toolkit.compress.int4_bench:run_bench",
                   technique="compress.bench", help=HELP, epilog=EPILOG,
                   flags=["model", "n", "k", "rows", "repeats", "a_bits", "new_tokens"],
                   inputs=lambda typed: {"model": typed["model"]})
