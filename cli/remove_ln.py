"""`iclrkit remove-ln run|analyze`: remove every LayerNorm of a GPT-2 by fine-tuning; analyze the LN-free model."""

from __future__ import annotations

import typer

from cli._fields import STANDARD, config_command
from toolkit.remove_ln.config import AnalyzeConfig, RemoveLNConfig

app = typer.Typer(no_args_is_help=True, help="Remove LayerNorm from GPT-2 by fine-tuning (arXiv 2507.02559).")


def _plan(config, ctx) -> dict:
    """--dry-run: the model's depth, the token budget and the exact removal step of every LayerNorm."""
    import json
    from pathlib import Path

    from toolkit.models.memory import whole_model_plan
    from toolkit.models.source import resolve_model_path
    from toolkit.remove_ln.schedule import build_schedule

    source = resolve_model_path(config.model)
    arch = json.loads((Path(source) / "config.json").read_text()) if Path(str(source)).is_dir() else {}
    layers, n_positions = arch.get("n_layer"), arch.get("n_positions", 1024)
    seqlen = config.seqlen or min(1024, n_positions)
    plan = {"model_type": arch.get("model_type"), "n_layer": layers, "seqlen": seqlen,
            "train_tokens": config.steps * config.batch_size * config.grad_accum * seqlen,
            "runs": ["ln_free"] + (["vanilla"] if config.vanilla_control else [])}
    if layers:
        events = build_schedule(layers, config.steps, config.start_fraction, config.end_fraction, config.gaps)
        plan["schedule"] = {event.name: event.step for event in events}
    plan["memory"] = whole_model_plan(config.model, "remove-ln fine-tunes the whole model (every block in each "
                                      "backward pass); it is loaded whole, with gradients and AdamW state")
    return plan


config_command(
    app, "run", config=RemoveLNConfig, run="toolkit.remove_ln.train:run_remove_ln", technique="remove-ln",
    help="Fine-tune with the LN-removal schedule, export an LN-free GPT-2 (plain and/or folded).",
    epilog="Examples: iclrkit remove-ln run -m zoo:gpt2-small -d train.txt --eval-data test.txt --steps 100 "
           "--batch-size 16 --seqlen 128 --vanilla-control -o runs/lnfree | "
           "iclrkit remove-ln run -m gpt2 -d openwebtext.txt --export both -o out --resume",
    flags=["model", "data", "eval_data", "steps", "batch_size", "grad_accum", "seqlen", "lr", "sigma_mode",
           "vanilla_control", "export"],
    common=(*STANDARD, "dtype", "resume"), plan=_plan,
    inputs=lambda f: {"model": f["model"], "data": f["data"], "eval_data": f["eval_data"]})

config_command(
    app, "analyze", config=AnalyzeConfig, run="toolkit.remove_ln.analyze:run_analyze", technique="remove-ln.analyze",
    help="Direct logit attribution per component (sums to the logits on an LN-free model) and CE.",
    epilog="Examples: iclrkit remove-ln analyze -m runs/lnfree/model -d test.txt --reference zoo:gpt2-small | "
           "iclrkit remove-ln analyze -m runs/lnfree/model-folded --json",
    flags=["model", "data", "reference", "seqlen", "windows"], common=(*STANDARD, "dtype"),
    inputs=lambda f: {"model": f["model"], "data": f["data"], "reference": f["reference"]}, needs_out=False,
    optional_out=True, plan="toolkit.remove_ln.analyze:plan_analyze")
