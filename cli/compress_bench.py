"""`iclrkit compress bench`: time the packed INT4 kernels (dense and 2:4) and a packed model against FP32.

Register in cli/compress.py with `app.command("bench", ...)(bench)` (see `bench.__doc__`)."""

from __future__ import annotations

from typing import Annotated

import typer

from cli._options import (
    ConfigOpt,
    DeviceOpt,
    DryRunOpt,
    JsonOpt,
    OutOpt,
    OverwriteOpt,
    SeedOpt,
    SetOpt,
)
from cli._runner import Common, execute

HELP = "Benchmark the INT4 GEMM kernels (W4A8, dense and 2:4) and a packed OBR model against FP32."
EPILOG = ("Examples: iclrkit compress bench --out runs/bench | iclrkit compress bench --model runs/obr/packed "
          "--rows 1 --rows 32 --out runs/bench-model --json")


def bench(model: Annotated[str | None, typer.Option("--model", "-m", help="Packed model directory from "
                                                      "`compress obr` (omit to time the GEMMs only).")] = None,
          n: Annotated[int | None, typer.Option(help="GEMM output features.")] = None,
          k: Annotated[int | None, typer.Option(help="GEMM input features.")] = None,
          rows: Annotated[list[int] | None, typer.Option("--rows", help="Token counts m (repeatable).")] = None,
          repeats: Annotated[int | None, typer.Option(help="Interleaved timing rounds (best of).")] = None,
          a_bits: Annotated[int | None, typer.Option("--a-bits", help="Activation bits (8 = W4A8).")] = None,
          new_tokens: Annotated[int | None, typer.Option(help="Decoded tokens per model timing.")] = None,
          out: OutOpt = None, config: ConfigOpt = None, set_: SetOpt = None, seed: SeedOpt = None,
          device: DeviceOpt = None, dry_run: DryRunOpt = False, json_: JsonOpt = False,
          overwrite: OverwriteOpt = False) -> None:
    """Wire with: `app.command("bench", help=HELP, epilog=EPILOG)(bench)` in cli/compress.py."""
    from toolkit.compress.int4_bench import BenchConfig, run_bench

    execute(technique="compress.bench", config_cls=BenchConfig,
            flags={"model": model, "n": n, "k": k, "rows": rows or None, "repeats": repeats, "a_bits": a_bits,
                   "new_tokens": new_tokens},
            common=Common.of(locals()),
            run=run_bench, inputs={"model": model})
