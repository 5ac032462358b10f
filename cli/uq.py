"""`iclrkit uq`: uncertainty quantification for LLM reasoning (TokUR).

Options come from the config's fields (toolkit/uq/config.py): each knob is declared once, there."""

from __future__ import annotations

import typer

from cli._fields import STANDARD, config_command
from toolkit.uq.config import TokURConfig

app = typer.Typer(no_args_is_help=True, help="Uncertainty quantification.")

config_command(
    app, "tokur", config=TokURConfig, run="toolkit.uq.run:run_tokur", technique="uq.tokur",
    help="Token-level total/aleatoric/epistemic uncertainty by low-rank weight perturbation; AUROC vs correctness "
         "and best-of-N selection.",
    epilog="Examples: iclrkit uq tokur -m zoo:smollm2-135m -d ../shared/data/gsm8k/test.jsonl --limit 20 "
           "-o runs/tokur | iclrkit uq tokur -m ./toy -d toy.jsonl --sigma 0.05 --samples 8 -o runs/toy --json",
    flags=["model", "data", "samples", "rank", "sigma", "candidates", "limit", "max_new_tokens", "score"],
    common=(*STANDARD, "dtype"), inputs=lambda f: {"data": f["data"]})
