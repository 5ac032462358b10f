"""`iclrkit prompt`: prompt inference (MHLP / Textual Bayes).

Options come from the config's fields (toolkit/prompt/config.py): each knob is declared once, there."""

from __future__ import annotations

import typer

from cli._fields import STANDARD, config_command
from toolkit.prompt.config import MHLPConfig

app = typer.Typer(no_args_is_help=True, help="Prompt inference.")
MHLP_FLAGS = ["task_model", "proposer_model", "data", "steps", "burn_in", "thinning", "chains", "beta",
              "initial_prompt", "meta_prompt", "eval_size", "train_size", "predictive", "chat", "concurrency"]

config_command(
    app, "mhlp", config=MHLPConfig, run="toolkit.prompt.run:run_mhlp", technique="prompt.mhlp",
    help="Bayesian inference over the system prompt: MH with LLM proposals (Textual Bayes).",
    epilog="Examples: iclrkit prompt mhlp --task-model zoo:smollm2-135m --proposer-model zoo:smollm2-135m "
           "-d qa.jsonl -o runs/mhlp | iclrkit prompt mhlp --task-model openai:m@http://host:8000/v1 "
           "--proposer-model openai:m@http://host:8000/v1 -d qa.jsonl --steps 20 --concurrency 8 -o out --json",
    flags=MHLP_FLAGS, common=(*STANDARD, "dtype"))
