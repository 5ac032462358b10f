"""`iclrkit causal influence`: influence power of actionable variables (Tao et al., ICLR 2026)."""

from __future__ import annotations

import typer

from cli._fields import config_command
from toolkit.causal.influence import InfluenceConfig

app = typer.Typer(no_args_is_help=True, help="Causal decision analysis.")

config_command(
    app, "influence", config=InfluenceConfig, run="toolkit.causal.influence:run", technique="causal.influence",
    help="Influence power of actionable variables: exact enumeration and the paper's UCT estimator, beside the "
         "average causal effect.",
    epilog="Examples: iclrkit causal influence --sem example:2 --out runs/inp | "
           "iclrkit causal influence --sem graph.yaml --data observations.csv --variable W --out runs/w | "
           "iclrkit causal influence --sem model.yaml --given U=1 --method exact --json",
    flags=["sem", "data", "variables", "given", "method", "iterations"],
    inputs=lambda f: {"sem": None if (f["sem"] or "").startswith("example:") else f["sem"], "data": f["data"]},
    needs_out=False, optional_out=True)
