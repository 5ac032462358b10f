"""`iclrkit study cot | benign-overfit`: analysis papers as reproducible experiments with plots.

Options come from the configs' fields (toolkit/study/): each knob is declared once, there."""

from __future__ import annotations

import typer

from cli._fields import config_command
from toolkit.study.benign_overfit import BenignOverfitConfig
from toolkit.study.cot_config import CotConfig

app = typer.Typer(no_args_is_help=True, help="Research studies as experiments (JSON + PNG in --out).")

config_command(
    app, "cot", config=CotConfig, run="toolkit.study.cot:run", plan="toolkit.study.cot:plan", technique="study.cot",
    help="Train GPT-2 from scratch on a synthetic two-hop KB with and without CoT targets; ID/OOD two-hop accuracy "
         "over training and logit-lens bridge ranks per layer.",
    epilog="Examples: iclrkit study cot --out runs/cot | iclrkit study cot --steps 300 --modes cot --out "
           "runs/cot-smoke | iclrkit study cot --config examples/cot/config.yaml --set label_noise=0.2 --out "
           "runs/cot-noise",
    flags=["steps", "modes", "label_noise"])

config_command(
    app, "benign-overfit", config=BenignOverfitConfig, run="toolkit.study.benign_overfit:run",
    technique="study.benign_overfit",
    help="GD on a leaky-ReLU two-layer net (fixed ±1/√m output layer) over a grid of n, d, ‖μ‖: train/test error "
         "vs the reference Φ(−‖μ‖²/√(‖μ‖²+d/n)).",
    epilog="Examples: iclrkit study benign-overfit --out runs/bo | iclrkit study benign-overfit --d 100,400 --mu 1,2 "
           "--loss logistic --json | iclrkit study benign-overfit --set noise=student_t --set dof=5 --out runs/bo-t",
    flags=["n_values", "d_values", "mu_norms", "loss", "steps", "repeats"], needs_out=False, optional_out=True)
