"""`iclrkit unlearn prism|npo|ga|rmu|eval|relearn`: robust LLM unlearning, its baselines, evaluation and attacks.

One command per objective registered in toolkit/unlearn/objectives/ (PRISM and its baselines), with the options its
registration names, generated from the config fields (toolkit/unlearn/config.py): a new objective is one file there
and appears here by itself. Each knob is declared once, on its field."""

from __future__ import annotations

import typer

import toolkit.unlearn.config  # noqa: F401 - declares the registry's objective modules (torch-free)
from cli._fields import STANDARD, config_command
from toolkit.core.registry import Entry, registry
from toolkit.unlearn.config import EVAL_FLAGS, EvalConfig, RelearnConfig

app = typer.Typer(no_args_is_help=True, help="Unlearn data from a language model; evaluate and attack the result.")
TRAIN_COMMON = (*STANDARD, "dtype", "resume")


def objective_command(app: typer.Typer, entry: Entry) -> None:
    """`iclrkit unlearn NAME` for one registered objective: its flags, help and examples come from its registration."""
    config_command(
        app, entry.name, config=entry.config, run="toolkit.unlearn.run:run_unlearn",
        plan="toolkit.unlearn.run:plan_unlearn", technique=f"unlearn.{entry.name}", help=entry.meta["help"],
        epilog=entry.meta.get("epilog"), flags=entry.meta["flags"], common=TRAIN_COMMON,
        fixed={"method": entry.name}, inputs=lambda f: {"forget": f.get("forget"), "retain": f.get("retain")})


for _entry in registry("unlearn"):
    objective_command(app, _entry)

config_command(
    app, "eval", config=EvalConfig, run="toolkit.unlearn.evaluate:run_eval", technique="unlearn.eval",
    help="MUSE-style metrics: VerbMem, KnowMem, PrivLeak (Min-k%), utility ppl, jailbreak attacks.",
    epilog="Examples: iclrkit unlearn eval -m runs/prism/model --verbmem verbmem.json --forget-qa fqa.json "
           "--retain-qa rqa.json --holdout holdout.json -r retain.json --reference-model zoo:gpt2-small",
    flags=EVAL_FLAGS, common=(*STANDARD, "dtype"), inputs=lambda f: {"verbmem": f["verbmem"]}, needs_out=False,
    optional_out=True)

config_command(
    app, "relearn", config=RelearnConfig, run="toolkit.unlearn.evaluate:run_relearn", technique="unlearn.relearn",
    help="Relearning attack: fine-tune on part of the forget set, then re-measure.",
    epilog="Examples: iclrkit unlearn relearn -m runs/prism/model -f forget.json --verbmem verbmem.json "
           "--steps 100 -o runs/prism-relearn",
    flags=[*EVAL_FLAGS, "forget", "steps", "fraction", "lr", "batch_size"], common=(*STANDARD, "dtype"),
    inputs=lambda f: {"forget": f["forget"], "verbmem": f["verbmem"]})
