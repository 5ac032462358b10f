"""`iclrkit eval ppl`: shared evaluators every recipe reuses."""

from __future__ import annotations

from typing import Annotated

import typer

from cli._options import (
    ConfigOpt,
    DataOpt,
    DeviceOpt,
    DryRunOpt,
    DtypeOpt,
    JsonOpt,
    ModelOpt,
    OutOpt,
    OverwriteOpt,
    SeedOpt,
    SetOpt,
)
from cli._runner import Common, execute

app = typer.Typer(no_args_is_help=True, help="Evaluate models.")


@app.command("ppl", help="Perplexity on text with strided windows.",
             epilog="Examples: iclrkit eval ppl --model zoo:gpt2-small --data embedded | "
                    "iclrkit eval ppl -m ./my-model -d test.txt --max-length 1024 --stride 512 --json")
def ppl(
    model: ModelOpt,
    data: DataOpt = None,
    max_length: Annotated[int, typer.Option(help="Window length in tokens.")] = None,
    stride: Annotated[int, typer.Option(help="Stride between windows (default: max length).")] = None,
    max_windows: Annotated[int, typer.Option(help="Score only the first N windows.")] = None,
    split: Annotated[str, typer.Option(help="train | test: the zoo's 95/5 paragraph split of the data.")] = None,
    out: OutOpt = None, config: ConfigOpt = None, set_: SetOpt = None, seed: SeedOpt = None,
    device: DeviceOpt = None, dtype: DtypeOpt = None, dry_run: DryRunOpt = False, json_: JsonOpt = False,
    overwrite: OverwriteOpt = False,
) -> None:
    from toolkit.eval.run import PerplexityConfig, run_perplexity

    execute(technique="eval.ppl", config_cls=PerplexityConfig,
            flags={"model": model, "data": data, "max_length": max_length, "stride": stride,
                   "max_windows": max_windows, "split": split},
            common=Common.of(locals()),
            run=run_perplexity, inputs={"data": data}, needs_out=False)
