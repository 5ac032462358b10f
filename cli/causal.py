"""`iclrkit causal influence`: influence power of actionable variables (Tao et al., ICLR 2026)."""

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

app = typer.Typer(no_args_is_help=True, help="Causal decision analysis.")


def _parse_given(items: list[str] | None) -> dict | None:
    if not items:
        return None
    from toolkit.core.errors import BadInputError

    given = {}
    for item in items:
        if "=" not in item:
            raise BadInputError(f"--given expects NAME=VALUE, got {item!r}")
        name, value = item.split("=", 1)
        given[name.strip()] = value.strip()
    return given


@app.command("influence", help="Influence power of actionable variables: exact enumeration and the paper's UCT "
                               "estimator, beside the average causal effect.",
             epilog="Examples: iclrkit causal influence --sem example:2 --out runs/inp | "
                    "iclrkit causal influence --sem graph.yaml --data observations.csv --variable W --out runs/w | "
                    "iclrkit causal influence --sem model.yaml --given U=1 --method exact --json")
def influence(
    sem: Annotated[str, typer.Option(help="Model spec .yaml/.json (variables, parents, roles, CPTs) or example:1..4.")],
    data: Annotated[str | None, typer.Option("--data", "-d", help="Observational CSV to fit the CPTs on.")] = None,
    variable: Annotated[list[str] | None, typer.Option(help="Actionable variable to measure (repeatable).")] = None,
    given: Annotated[list[str] | None, typer.Option(help="Observed NAME=VALUE before the decision.")] = None,
    method: Annotated[str | None, typer.Option(help="exact | mcts | both.")] = None,
    iterations: Annotated[int | None, typer.Option(help="UCT iterations per variable.")] = None,
    out: OutOpt = None, config: ConfigOpt = None, set_: SetOpt = None, seed: SeedOpt = None,
    device: DeviceOpt = None, dry_run: DryRunOpt = False, json_: JsonOpt = False, overwrite: OverwriteOpt = False,
) -> None:
    from toolkit.causal.influence import InfluenceConfig, run

    common = Common.of(locals())
    try:
        parsed_given = _parse_given(given)
    except Exception as exc:  # noqa: BLE001 - reported like every other bad input
        from cli._runner import fail

        fail(exc)
    execute(technique="causal.influence", config_cls=InfluenceConfig,
            flags={"sem": sem, "data": data, "variables": variable or None, "given": parsed_given, "method": method,
                   "iterations": iterations},
            common=common, run=run,
            inputs={"sem": sem if not sem.startswith("example:") else None, "data": data}, needs_out=False)
