"""`iclrkit remove-ln run|analyze`: remove every LayerNorm of a GPT-2 by fine-tuning; analyze the LN-free model."""

from __future__ import annotations

from typing import Annotated

import typer

from cli._options import (
    ConfigOpt,
    DataOpt,
    DeviceOpt,
    DryRunOpt,
    DtypeOpt,
    JsonOpt,
    ModelOpt,
    OutOpt,
    OverwriteOpt,
    ResumeOpt,
    SeedOpt,
    SetOpt,
)
from cli._runner import Common, execute

app = typer.Typer(no_args_is_help=True, help="Remove LayerNorm from GPT-2 by fine-tuning (arXiv 2507.02559).")


def _plan(config, ctx) -> dict:
    """--dry-run: the model's depth, the token budget and the exact removal step of every LayerNorm."""
    import json
    from pathlib import Path

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
    return plan


@app.command("run", help="Fine-tune with the LN-removal schedule, export an LN-free GPT-2 (plain and/or folded).",
             epilog="Examples: iclrkit remove-ln run -m zoo:gpt2-small -d train.txt --eval-data test.txt "
                    "--steps 100 --batch-size 16 --seqlen 128 --vanilla-control -o runs/lnfree | "
                    "iclrkit remove-ln run -m gpt2 -d openwebtext.txt --export both -o out --resume")
def run(
    model: ModelOpt,
    data: DataOpt = None,
    eval_data: Annotated[str | None, typer.Option(help="Text for CE (default: 5% held out of --data).")] = None,
    steps: Annotated[int | None, typer.Option(help="Optimizer steps (paper: 300 for GPT-2 small).")] = None,
    batch_size: Annotated[int | None, typer.Option(help="Sequences per micro-batch.")] = None,
    grad_accum: Annotated[int | None, typer.Option(help="Micro-batches per optimizer step.")] = None,
    seqlen: Annotated[int | None, typer.Option(help="Tokens per sequence (default min(1024, n_positions)).")] = None,
    lr: Annotated[float | None, typer.Option(help="Peak learning rate (paper 6e-4).")] = None,
    sigma_mode: Annotated[str | None, typer.Option(
        help="recompute_on_real (paper) | recompute_on_fake | initial: how σ_avg is tracked.")] = None,
    vanilla_control: Annotated[bool | None, typer.Option(
        "--vanilla-control/--no-vanilla-control", help="Also fine-tune with LayerNorm on the same tokens.")] = None,
    export: Annotated[str | None, typer.Option(help="plain | folded | both.")] = None,
    out: OutOpt = None, config: ConfigOpt = None, set_: SetOpt = None, seed: SeedOpt = None,
    device: DeviceOpt = None, dtype: DtypeOpt = None, dry_run: DryRunOpt = False, json_: JsonOpt = False,
    overwrite: OverwriteOpt = False, resume: ResumeOpt = False,
) -> None:
    from toolkit.remove_ln.train import RemoveLNConfig, run_remove_ln

    execute(technique="remove-ln", config_cls=RemoveLNConfig,
            flags={"model": model, "data": data, "eval_data": eval_data, "steps": steps, "batch_size": batch_size,
                   "grad_accum": grad_accum, "seqlen": seqlen, "lr": lr, "sigma_mode": sigma_mode,
                   "vanilla_control": vanilla_control, "export": export},
            common=Common.of(locals()),
            run=run_remove_ln, inputs={"model": model, "data": data, "eval_data": eval_data}, plan=_plan)


@app.command("analyze", help="Direct logit attribution per component (sums to the logits on an LN-free model) and CE.",
             epilog="Examples: iclrkit remove-ln analyze -m runs/lnfree/model -d test.txt --reference zoo:gpt2-small | "
                    "iclrkit remove-ln analyze -m runs/lnfree/model-folded --json")
def analyze(
    model: ModelOpt,
    data: DataOpt = None,
    reference: Annotated[str | None, typer.Option(help="Compare with this model (e.g. the original).")] = None,
    seqlen: Annotated[int | None, typer.Option(help="Tokens per window (default min(128, n_positions)).")] = None,
    windows: Annotated[int | None, typer.Option(help="Windows for DLA.")] = None,
    out: OutOpt = None, config: ConfigOpt = None, set_: SetOpt = None, seed: SeedOpt = None,
    device: DeviceOpt = None, dtype: DtypeOpt = None, dry_run: DryRunOpt = False, json_: JsonOpt = False,
    overwrite: OverwriteOpt = False,
) -> None:
    from toolkit.remove_ln.analyze import AnalyzeConfig, run_analyze

    execute(technique="remove-ln.analyze", config_cls=AnalyzeConfig,
            flags={"model": model, "data": data, "reference": reference, "seqlen": seqlen, "windows": windows},
            common=Common.of(locals()),
            run=run_analyze, inputs={"model": model, "data": data, "reference": reference}, needs_out=False)
