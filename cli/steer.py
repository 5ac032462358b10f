"""`iclrkit steer pcms|ums|ilcs|generate|sweep`: personalized safety steering by activation intervention.

Options come from the configs' fields (toolkit/steer/run.py): each knob is declared once, there."""

from __future__ import annotations

import typer

from cli._fields import STANDARD, config_command
from toolkit.core.registry import registry
from toolkit.steer.run import GenerateConfig, SteerConfig, SweepConfig

app = typer.Typer(no_args_is_help=True, help="Personalized safety steering (PCMS, UMS, ILCS).")
COMMON = (*STANDARD, "dtype")

# one command per estimator registered in toolkit/steer/methods/: a new estimator appears here by itself
for _entry in registry("steer"):
    _name, _help = _entry.name, _entry.meta["help"]
    config_command(
        app, _name, config=_entry.config or SteerConfig, run="toolkit.steer.run:run_estimate", technique=f"steer.{_name}",
        help=f"{_help} Writes directions.safetensors (layer + model fingerprint).",
        epilog=f"Examples: iclrkit steer {_name} -m zoo:smollm2-135m -d pairs.jsonl --layer 15 -o dirs/ | "
               "pairs.jsonl lines: {\"undesired\": \"...\", \"neutral\": \"...\"}",
        flags=_entry.meta.get("flags", ["model", "data", "layers", "position"]), common=COMMON,
        fixed={"method": _name},
        inputs=lambda f: {"data": f["data"]}, plan="toolkit.steer.run:plan_estimate")

config_command(
    app, "generate", config=GenerateConfig, run="toolkit.steer.run:run_generate", technique="steer.generate",
    help="Generate with saved directions subtracted (h - alpha*v, or projection removal).",
    epilog="Examples: iclrkit steer generate -m zoo:smollm2-135m --direction dirs/directions.safetensors "
           "--alpha 1 --prompt 'The soldier drew his sword and' -o gen/",
    flags=["model", "directions", "prompts", "data", "alpha", "operator", "layers", "max_new_tokens"],
    common=COMMON, inputs=lambda f: {"data": f["data"]}, plan="toolkit.steer.run:plan_generate")

config_command(
    app, "sweep", config=SweepConfig, run="toolkit.steer.sweep:run_sweep", technique="steer.sweep",
    help="Method x layer x alpha grid: category probability drop (lexicon + MiniLM classifier), neutral KL, "
         "neutral perplexity ratio, split-half cosine; results.json + sweep.png.",
    epilog="Examples: iclrkit steer sweep -m zoo:smollm2-135m -d pairs.jsonl --prompts prompts.jsonl "
           "--config examples/steer/config.yaml -o sweep/",
    flags=["model", "data", "prompts", "layers", "alphas", "methods", "operator"], common=COMMON,
    inputs=lambda f: {"data": f["data"], "prompts": f["prompts"]}, plan="toolkit.steer.run:plan_generate")
