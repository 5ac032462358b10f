"""`iclrkit cluster khc solve|generate`: k-hyperplane clustering to proven optimality (SCIP) and planted instances."""

from __future__ import annotations

from typing import Annotated

import typer

from cli._options import (
    ConfigOpt,
    DryRunOpt,
    JsonOpt,
    OutOpt,
    OverwriteOpt,
    SeedOpt,
    SetOpt,
)
from cli._runner import Common, execute

app = typer.Typer(no_args_is_help=True, help="Clustering.")
khc = typer.Typer(no_args_is_help=True, help="2-norm k-hyperplane clustering (k-HC2) solved to proven optimality.")
app.add_typer(khc, name="khc")

PointsOpt = Annotated[str | None, typer.Option("--data", "-d", help="Points: .csv (rows = points) or .npy (n x d).")]


@khc.command("solve", help="Fit k hyperplanes minimising the summed squared distances; prove optimality with SCIP.",
             epilog="Examples: iclrkit cluster khc solve -d points.csv -k 3 --out runs/khc | "
                    "iclrkit cluster khc solve -d pts.npy -k 2 --formulation multi --time-limit 60 -o runs/khc2 --json | "
                    "iclrkit cluster khc solve -d pts.csv -k 3 --heuristic-only --out runs/kplanes | "
                    "iclrkit cluster khc solve -d pts.csv -k 3 --dry-run")
def solve(
    data: PointsOpt = None,
    k: Annotated[int | None, typer.Option("--k", "-k", help="Number of hyperplanes.")] = None,
    formulation: Annotated[str | None, typer.Option(
        help="plain (k-HC(2,1)) | inf (+||w||_inf >= 1/sqrt d) | one (+||w||_1 >= 1) | multi (both).")] = None,
    heuristic_only: Annotated[bool | None, typer.Option(
        "--heuristic-only/--no-heuristic-only", help="Only the k-planes heuristic (no SCIP).")] = None,
    time_limit: Annotated[float | None, typer.Option(help="SCIP time limit in seconds.")] = None,
    gap: Annotated[float | None, typer.Option(help="Stop at this relative gap (0 = prove the optimum).")] = None,
    node_limit: Annotated[int | None, typer.Option(help="Branch-and-bound node limit (-1 = none).")] = None,
    threads: Annotated[int | None, typer.Option(help="> 1: SCIP concurrent solve with this many threads.")] = None,
    restarts: Annotated[int | None, typer.Option(help="k-planes restarts for the warm start.")] = None,
    warm_start: Annotated[bool | None, typer.Option(
        "--warm-start/--no-warm-start", help="Give SCIP the heuristic solution as incumbent.")] = None,
    tighten: Annotated[bool | None, typer.Option(
        "--tighten/--no-tighten", help="Add our valid tightenings (data big-M, ||w||<=1, orbitopal symmetry, "
                                       "spread point order); not in the paper.")] = None,
    plot: Annotated[bool | None, typer.Option("--plot/--no-plot", help="plot.png for 2-D/3-D data.")] = None,
    out: OutOpt = None, config: ConfigOpt = None, set_: SetOpt = None, seed: SeedOpt = None,
    dry_run: DryRunOpt = False, json_: JsonOpt = False, overwrite: OverwriteOpt = False,
) -> None:
    from toolkit.cluster.khc import KhcConfig, plan, run

    execute(technique="cluster.khc", config_cls=KhcConfig,
            flags={"data": data, "k": k, "formulation": formulation, "heuristic_only": heuristic_only,
                   "time_limit": time_limit, "gap": gap, "node_limit": node_limit, "threads": threads,
                   "restarts": restarts, "warm_start": warm_start, "tighten": tighten, "plot": plot},
            common=Common.of(locals()),
            run=run, plan=plan, inputs={"data": data})


@khc.command("generate", help="Write a planted instance: points near k random hyperplanes, with noise and outliers.",
             epilog="Examples: iclrkit cluster khc generate -n 30 --dim 2 -k 3 --seed 1 --out data/khc30 | "
                    "iclrkit cluster khc generate -n 60 --dim 3 -k 2 --outliers 0.1 --format npy --out data/o")
def generate(
    n: Annotated[int | None, typer.Option("--n", "-n", help="Number of points.")] = None,
    dim: Annotated[int | None, typer.Option("--dim", help="Dimension d.")] = None,
    k: Annotated[int | None, typer.Option("--k", "-k", help="Number of planted hyperplanes.")] = None,
    noise: Annotated[float | None, typer.Option(help="Max noise variance along the normal (paper: 0.003).")] = None,
    outliers: Annotated[float | None, typer.Option(help="Share of points replaced by uniform outliers.")] = None,
    format_: Annotated[str | None, typer.Option("--format", help="csv | npy.")] = None,
    out: OutOpt = None, config: ConfigOpt = None, set_: SetOpt = None, seed: SeedOpt = None,
    dry_run: DryRunOpt = False, json_: JsonOpt = False, overwrite: OverwriteOpt = False,
) -> None:
    from toolkit.cluster.khc import KhcGenerateConfig, run_generate

    execute(technique="cluster.khc.generate", config_cls=KhcGenerateConfig,
            flags={"n": n, "d": dim, "k": k, "noise": noise, "outlier_fraction": outliers, "format": format_},
            common=Common.of(locals()),
            run=run_generate)
