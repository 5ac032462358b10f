"""`iclrkit defend backdoor|attack`: X-GRAAD backdoor detection and neutralisation, and a BadNets victim to test it."""

from __future__ import annotations

from typing import Annotated, Optional

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
    SeedOpt,
    SetOpt,
)
from cli._runner import Common, execute

app = typer.Typer(no_args_is_help=True, help="Inference-time defenses.")


@app.command("backdoor", help="X-GRAAD: attention x gradient anomaly score per input, threshold at a percentile of "
                              "held-out clean scores, neutralise the top token and re-classify. With --trigger it "
                              "evaluates ASR/CACC and the STRIP/ONION baselines (--baseline).",
             epilog="Examples: iclrkit defend backdoor -m victim/model -d test.tsv --clean victim/heldout.tsv -o scan/ | "
                    "iclrkit defend backdoor -m victim/model -d dev.tsv --clean victim/heldout.tsv --trigger cf "
                    "--baseline strip --baseline onion -o eval/")
def backdoor(
    model: ModelOpt,
    data: DataOpt = None,
    clean: Annotated[Optional[str], typer.Option(help="Held-out clean texts (TSV/JSONL) for the threshold.")] = None,
    percentile: Annotated[Optional[float], typer.Option(help="Threshold percentile of clean scores.")] = None,
    trigger: Annotated[Optional[str], typer.Option(help="Evaluate against this known trigger.")] = None,
    baseline: Annotated[Optional[list[str]], typer.Option("--baseline", help="strip | onion (repeatable).")] = None,
    out: OutOpt = None, config: ConfigOpt = None, set_: SetOpt = None, seed: SeedOpt = None,
    device: DeviceOpt = None, dtype: DtypeOpt = None, dry_run: DryRunOpt = False, json_: JsonOpt = False,
    overwrite: OverwriteOpt = False,
) -> None:
    from toolkit.defend.run import BackdoorConfig, run_backdoor

    execute(technique="defend.backdoor", config_cls=BackdoorConfig,
            flags={"model": model, "data": data, "clean": clean, "percentile": percentile, "eval_trigger": trigger,
                   "baselines": baseline or None},
            common=Common.of(locals()),
            run=run_backdoor, inputs={"data": data, "clean": clean, "model": model})


@app.command("attack", help="Poison a labelled set with a rare-word trigger (BadNets), fine-tune an encoder "
                            "classifier on it; writes model/ and heldout.tsv (clean rows for calibration).",
             epilog="Examples: iclrkit defend attack -d shared/data/sst2/train.tsv --eval-data shared/data/sst2/dev.tsv "
                    "--trigger cf -o victim/")
def attack(
    data: DataOpt = None,
    encoder: Annotated[Optional[str], typer.Option(help="'minilm' (installed all-MiniLM-L6-v2) or a directory.")] = None,
    eval_data: Annotated[Optional[str], typer.Option(help="Labelled test set for CACC and ASR.")] = None,
    trigger: Annotated[Optional[str], typer.Option(help="Trigger word(s).")] = None,
    poison_rate: Annotated[Optional[float], typer.Option(help="Share of the training set poisoned.")] = None,
    n_train: Annotated[Optional[int], typer.Option(help="Training sentences sampled from --data.")] = None,
    epochs: Annotated[Optional[int], typer.Option(help="Fine-tuning epochs.")] = None,
    out: OutOpt = None, config: ConfigOpt = None, set_: SetOpt = None, seed: SeedOpt = None,
    device: DeviceOpt = None, dtype: DtypeOpt = None, dry_run: DryRunOpt = False, json_: JsonOpt = False,
    overwrite: OverwriteOpt = False,
) -> None:
    from toolkit.defend.run import AttackConfig, run_attack

    execute(technique="defend.attack", config_cls=AttackConfig,
            flags={"data": data, "encoder": encoder, "eval_data": eval_data, "trigger": trigger,
                   "poison_rate": poison_rate, "n_train": n_train, "epochs": epochs},
            common=Common.of(locals()),
            run=run_attack, inputs={"data": data, "eval_data": eval_data})
