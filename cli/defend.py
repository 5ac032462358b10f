"""`iclrkit defend attack|backdoor`: BadNets victims and the X-GRAAD inference-time backdoor defense.

Options come from the configs' fields (toolkit/defend/run.py): each knob is declared once, there."""

from __future__ import annotations

import typer

from cli._fields import STANDARD, config_command
from toolkit.defend.run import AttackConfig, BackdoorConfig

app = typer.Typer(no_args_is_help=True, help="Inference-time defenses.")
COMMON = (*STANDARD, "dtype")

config_command(
    app, "backdoor", config=BackdoorConfig, run="toolkit.defend.run:run_backdoor", technique="defend.backdoor",
    help="X-GRAAD: attention x gradient anomaly score per input, threshold at a percentile of held-out clean scores, "
         "neutralise the top token and re-classify. With --trigger it evaluates ASR/CACC and the STRIP/ONION "
         "baselines (--baseline).",
    epilog="Examples: iclrkit defend backdoor -m victim/model -d test.tsv --clean victim/heldout.tsv -o scan/ | "
           "iclrkit defend backdoor -m victim/model -d dev.tsv --clean victim/heldout.tsv --trigger cf "
           "--baseline strip --baseline onion -o eval/",
    flags=["model", "data", "clean", "percentile", "eval_trigger", "baselines"], common=COMMON,
    inputs=lambda f: {"data": f["data"], "clean": f["clean"], "model": f["model"]})

config_command(
    app, "attack", config=AttackConfig, run="toolkit.defend.run:run_attack", technique="defend.attack",
    help="Poison a labelled set with a rare-word trigger (BadNets), fine-tune an encoder classifier on it; writes "
         "model/ and heldout.tsv (clean rows for calibration).",
    epilog="Examples: iclrkit defend attack -d shared/data/sst2/train.tsv --eval-data shared/data/sst2/dev.tsv "
           "--trigger cf -o victim/",
    flags=["data", "encoder", "eval_data", "trigger", "poison_rate", "n_train", "epochs"], common=COMMON,
    inputs=lambda f: {"data": f["data"], "eval_data": f["eval_data"]})
