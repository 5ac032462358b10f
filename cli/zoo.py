"""`iclrkit zoo list|build`: reference models trained or converted here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from cli._options import DataOpt, SeedOpt
from cli._runner import ROOT_STATE, failing_in_one_line

app = typer.Typer(no_args_is_help=True, help="Reference models built here (cached in ~/.cache/iclrkit/zoo).")


@app.command("list", help="List zoo models and whether they are cached.")
def list_cmd(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    from toolkit.zoo.registry import list_models

    rows = list_models()
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table("name", "description", "build min", "cached", "variants")
    for row in rows:
        table.add_row(row["name"], row["description"], row["build_minutes"], "yes" if row["cached"] else "no",
                      ", ".join(row["variants"]))
    Console().print(table)


@app.command("build", help="Build (train or convert) a zoo model into the cache.",
             epilog="Examples: iclrkit zoo build gpt2-small | "
                    "iclrkit zoo build llama-small --data wikitext-2/valid.txt")
def build_cmd(
    name: Annotated[str, typer.Argument(help="Recipe name (see `iclrkit zoo list`).")],
    data: DataOpt = None,
    steps: Annotated[Optional[int], typer.Option(min=1, help="Training steps (recipe default otherwise).")] = None,
    layers: Annotated[Optional[int], typer.Option(min=1, help="Override the number of blocks (LM recipes).")] = None,
    seed: SeedOpt = None,
    force: Annotated[bool, typer.Option("--force", help="Rebuild even if cached.")] = False,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    with failing_in_one_line():  # SIGTERM too: one line, exit 143, the half-built model removed
        from toolkit.models.inputs import check_input
        from toolkit.zoo.registry import build

        if data:
            check_input(data, "data", "--data")

        options = {"layers": layers} if layers else {}
        path, stats = build(name, data=data, steps=steps, seed=seed if seed is not None else (ROOT_STATE["seed"] or 0),
                            force=force, quiet=ROOT_STATE["verbosity"] < 0, **options)
    spec = f"zoo:{Path(path).name}"
    if as_json:
        typer.echo(json.dumps({"model": spec, "path": str(path), **stats}, indent=2))
    else:
        typer.echo(f"{spec}\t{path}" + (f"\tval_loss={stats['val_loss']:.3f}" if "val_loss" in stats else ""))
