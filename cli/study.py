"""`iclrkit study cot | benign-overfit`: analysis papers as reproducible experiments with plots."""

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

app = typer.Typer(no_args_is_help=True, help="Research studies as experiments (JSON + PNG in --out).")


def _floats(text: str | None) -> list[float] | None:
    return None if text is None else [float(v) for v in text.split(",") if v.strip()]


def _ints(text: str | None) -> list[int] | None:
    return None if text is None else [int(v) for v in text.split(",") if v.strip()]


def _parsed(parse, text, flag):
    from toolkit.core.errors import BadInputError

    try:
        return parse(text)
    except ValueError:
        raise BadInputError(f"{flag} expects comma-separated numbers, got {text!r}") from None


@app.command("cot", help="Train GPT-2 from scratch on a synthetic two-hop KB with and without CoT targets; "
                         "ID/OOD two-hop accuracy over training and logit-lens bridge ranks per layer.",
             epilog="Examples: iclrkit study cot --out runs/cot | "
                    "iclrkit study cot --steps 300 --modes cot --out runs/cot-smoke | "
                    "iclrkit study cot --config examples/cot/config.yaml --set label_noise=0.2 --out runs/cot-noise")
def cot(
    steps: Annotated[int | None, typer.Option(help="Training steps per model.")] = None,
    modes: Annotated[list[str] | None, typer.Option(help="cot and/or nocot (repeatable).")] = None,
    label_noise: Annotated[float | None, typer.Option(help="Share of two-hop train items with a random t.")] = None,
    out: OutOpt = None, config: ConfigOpt = None, set_: SetOpt = None, seed: SeedOpt = None,
    device: DeviceOpt = None, dry_run: DryRunOpt = False, json_: JsonOpt = False, overwrite: OverwriteOpt = False,
) -> None:
    from toolkit.study.cot import CotConfig, plan, run

    execute(technique="study.cot", config_cls=CotConfig,
            flags={"steps": steps, "modes": modes or None, "label_noise": label_noise},
            common=Common.of(locals()),
            run=run, plan=plan)


@app.command("benign-overfit", help="GD on a leaky-ReLU two-layer net (fixed ±1/√m output layer) over a grid of "
                                    "n, d, ‖μ‖: train/test error vs the reference Φ(−‖μ‖²/√(‖μ‖²+d/n)).",
             epilog="Examples: iclrkit study benign-overfit --out runs/bo | "
                    "iclrkit study benign-overfit --d 100,400 --mu 1,2 --loss logistic --json | "
                    "iclrkit study benign-overfit --set noise=student_t --set dof=5 --out runs/bo-t")
def benign_overfit(
    n: Annotated[str | None, typer.Option(help="Training-set sizes, comma-separated.")] = None,
    d: Annotated[str | None, typer.Option(help="Dimensions, comma-separated.")] = None,
    mu: Annotated[str | None, typer.Option(help="Signal norms ‖μ‖, comma-separated.")] = None,
    loss: Annotated[str | None, typer.Option(help="exponential | logistic.")] = None,
    steps: Annotated[int | None, typer.Option(help="GD steps.")] = None,
    repeats: Annotated[int | None, typer.Option(help="Training sets per grid point.")] = None,
    out: OutOpt = None, config: ConfigOpt = None, set_: SetOpt = None, seed: SeedOpt = None,
    device: DeviceOpt = None, dry_run: DryRunOpt = False, json_: JsonOpt = False, overwrite: OverwriteOpt = False,
) -> None:
    from toolkit.study.benign_overfit import BenignOverfitConfig, run

    common = Common.of(locals())

    def flags():
        return {"n_values": _parsed(_ints, n, "--n"), "d_values": _parsed(_ints, d, "--d"),
                "mu_norms": _parsed(_floats, mu, "--mu"), "loss": loss, "steps": steps, "repeats": repeats}

    try:
        typed = flags()
    except Exception as exc:  # noqa: BLE001 - reported like every other bad input
        from cli._runner import fail

        fail(exc)
    execute(technique="study.benign_overfit", config_cls=BenignOverfitConfig, flags=typed, common=common, run=run,
            needs_out=False)
