"""`iclrkit cluster khc solve|generate`: k-hyperplane clustering to proven optimality (SCIP) and planted instances.

Options come from the configs' fields (toolkit/cluster/config.py): each knob is declared once, there."""

from __future__ import annotations

import typer

from cli._fields import config_command
from toolkit.cluster.config import KhcConfig, KhcGenerateConfig

app = typer.Typer(no_args_is_help=True, help="Clustering.")
khc = typer.Typer(no_args_is_help=True, help="2-norm k-hyperplane clustering (k-HC2) solved to proven optimality.")
app.add_typer(khc, name="khc")
COMMON = ("out", "config", "set_", "seed", "dry_run", "json_", "overwrite")

config_command(
    khc, "solve", config=KhcConfig, run="toolkit.cluster.khc:run", plan="toolkit.cluster.khc:plan",
    technique="cluster.khc", help="Fit k hyperplanes minimising the summed squared distances; prove optimality "
                                  "with SCIP.",
    epilog="Examples: iclrkit cluster khc solve -d points.csv -k 3 --out runs/khc | "
           "iclrkit cluster khc solve -d pts.npy -k 2 --formulation multi --time-limit 60 -o runs/khc2 --json | "
           "iclrkit cluster khc solve -d pts.csv -k 3 --heuristic-only --out runs/kplanes | "
           "iclrkit cluster khc solve -d pts.csv -k 3 --dry-run",
    flags=["data", "k", "formulation", "heuristic_only", "time_limit", "gap", "node_limit", "threads", "restarts",
           "warm_start", "tighten", "plot"], common=COMMON, inputs=lambda f: {"data": f["data"]})

config_command(
    khc, "generate", config=KhcGenerateConfig, run="toolkit.cluster.khc:run_generate",
    technique="cluster.khc.generate",
    help="Write a planted instance: points near k random hyperplanes, with noise and outliers.",
    epilog="Examples: iclrkit cluster khc generate -n 30 --dim 2 -k 3 --seed 1 --out data/khc30 | "
           "iclrkit cluster khc generate -n 60 --dim 3 -k 2 --outliers 0.1 --format npy --out data/o",
    flags=["n", "d", "k", "noise", "outlier_fraction", "format"], common=COMMON)
