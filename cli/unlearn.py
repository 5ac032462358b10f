"""`iclrkit unlearn prism|npo|ga|rmu|eval|relearn`: robust LLM unlearning, its baselines, evaluation and attacks."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from cli._options import (
    ConfigOpt,
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

app = typer.Typer(no_args_is_help=True, help="Unlearn data from a language model; evaluate and attack the result.")

ForgetOpt = Annotated[str, typer.Option("--forget", "-f", help="Forget documents: .txt (blank-line blocks), "
                                                               ".json list or .jsonl ({text}|{prompt,gt}|str).")]
RetainOpt = Annotated[Optional[str], typer.Option("--retain", "-r", help="Retain documents (same formats).")]
EpochsOpt = Annotated[Optional[int], typer.Option("--epochs", help="Passes over the forget windows.")]
StepsOpt = Annotated[Optional[int], typer.Option("--max-steps", help="Stop after N steps.")]
LrOpt = Annotated[Optional[float], typer.Option("--lr", help="Learning rate.")]
BatchOpt = Annotated[Optional[int], typer.Option("--batch-size", help="Windows per step.")]
LengthOpt = Annotated[Optional[int], typer.Option("--max-length", help="Tokens per training window.")]
VerbmemOpt = Annotated[str, typer.Option("--verbmem", help="Forget continuations: .json/.jsonl {prompt, gt}.")]
ForgetQaOpt = Annotated[Optional[str], typer.Option("--forget-qa", help="KnowMem forget QA {question, answer}.")]
RetainQaOpt = Annotated[Optional[str], typer.Option("--retain-qa", help="KnowMem retain QA {question, answer}.")]
HoldoutOpt = Annotated[Optional[str], typer.Option("--holdout", help="Non-member documents for PrivLeak.")]
UtilityOpt = Annotated[Optional[str], typer.Option("--retain", "-r", help="Retain text for the utility perplexity.")]
ReferenceOpt = Annotated[Optional[str], typer.Option("--reference-model", help="A model never trained on the "
                                                                                "forget set (PrivLeak's retrain).")]


def _unlearn(technique: str, config_cls, run, flags: dict, common: Common, plan=None) -> None:
    execute(technique=technique, config_cls=config_cls, flags=flags, common=common, run=run,
            inputs={"forget": flags["forget"], "retain": flags.get("retain")}, plan=plan)


def _train_flags(model, forget, retain, epochs, max_steps, lr, batch_size, max_length) -> dict:
    return {"model": model, "forget": forget, "retain": retain, "epochs": epochs, "max_steps": max_steps, "lr": lr,
            "batch_size": batch_size, "max_length": max_length}


@app.command("prism", help="PRISM: robust probe, then NPO + annealed probe term + SAM + retain-orthogonal forget "
                           "gradient.",
             epilog="Examples: iclrkit unlearn prism -m ./memorised -f forget.json -r retain.json -o runs/prism | "
                    "iclrkit unlearn prism -m zoo:smollm2-135m -f forget.txt -r retain.txt --set sam_rho=0 -o out")
def prism(model: ModelOpt, forget: ForgetOpt, retain: RetainOpt = None, epochs: EpochsOpt = None,
          max_steps: StepsOpt = None, lr: LrOpt = None, batch_size: BatchOpt = None, max_length: LengthOpt = None,
          probe_layer: Annotated[Optional[int], typer.Option(help="Hidden-state index of the probe.")] = None,
          sam_rho: Annotated[Optional[float], typer.Option(help="SAM radius ρ (0 disables SAM).")] = None,
          adv_gamma: Annotated[Optional[float], typer.Option(help="γ_max of the probe term (0 disables).")] = None,
          out: OutOpt = None, config: ConfigOpt = None, set_: SetOpt = None, seed: SeedOpt = None,
          device: DeviceOpt = None, dtype: DtypeOpt = None, dry_run: DryRunOpt = False, json_: JsonOpt = False,
          overwrite: OverwriteOpt = False, resume: ResumeOpt = False) -> None:
    from toolkit.unlearn.prism import PrismConfig, plan, run_prism

    flags = _train_flags(model, forget, retain, epochs, max_steps, lr, batch_size, max_length)
    _unlearn("unlearn.prism", PrismConfig, run_prism,
             {**flags, "probe_layer": probe_layer, "sam_rho": sam_rho, "adv_gamma": adv_gamma}, Common.of(locals()),
             plan)


@app.command("npo", help="NPO on the forget set plus the retain NLL (MUSE npo_gdr).",
             epilog="Examples: iclrkit unlearn npo -m ./memorised -f forget.json -r retain.json -o runs/npo")
def npo(model: ModelOpt, forget: ForgetOpt, retain: RetainOpt = None, epochs: EpochsOpt = None,
        max_steps: StepsOpt = None, lr: LrOpt = None, batch_size: BatchOpt = None, max_length: LengthOpt = None,
        out: OutOpt = None, config: ConfigOpt = None, set_: SetOpt = None, seed: SeedOpt = None,
        device: DeviceOpt = None, dtype: DtypeOpt = None, dry_run: DryRunOpt = False, json_: JsonOpt = False,
        overwrite: OverwriteOpt = False, resume: ResumeOpt = False) -> None:
    from toolkit.unlearn.baselines import NpoConfig, run_npo

    _unlearn("unlearn.npo", NpoConfig, run_npo,
             _train_flags(model, forget, retain, epochs, max_steps, lr, batch_size, max_length), Common.of(locals()))


@app.command("ga", help="Gradient ascent on the forget NLL (add --set retain_coeff=1 for GA+GDR).",
             epilog="Examples: iclrkit unlearn ga -m ./memorised -f forget.json -o runs/ga")
def ga(model: ModelOpt, forget: ForgetOpt, retain: RetainOpt = None, epochs: EpochsOpt = None,
       max_steps: StepsOpt = None, lr: LrOpt = None, batch_size: BatchOpt = None, max_length: LengthOpt = None,
       out: OutOpt = None, config: ConfigOpt = None, set_: SetOpt = None, seed: SeedOpt = None,
       device: DeviceOpt = None, dtype: DtypeOpt = None, dry_run: DryRunOpt = False, json_: JsonOpt = False,
       overwrite: OverwriteOpt = False, resume: ResumeOpt = False) -> None:
    from toolkit.unlearn.baselines import GaConfig, run_ga

    _unlearn("unlearn.ga", GaConfig, run_ga,
             _train_flags(model, forget, retain, epochs, max_steps, lr, batch_size, max_length), Common.of(locals()))


@app.command("rmu", help="RMU: push layer-l forget activations to a random direction, keep retain activations.",
             epilog="Examples: iclrkit unlearn rmu -m ./memorised -f forget.json -r retain.json --layer 2 -o runs/rmu")
def rmu(model: ModelOpt, forget: ForgetOpt, retain: RetainOpt = None, epochs: EpochsOpt = None,
        max_steps: StepsOpt = None, lr: LrOpt = None, batch_size: BatchOpt = None, max_length: LengthOpt = None,
        layer: Annotated[Optional[int], typer.Option(help="Hidden-state index l.")] = None,
        out: OutOpt = None, config: ConfigOpt = None, set_: SetOpt = None, seed: SeedOpt = None,
        device: DeviceOpt = None, dtype: DtypeOpt = None, dry_run: DryRunOpt = False, json_: JsonOpt = False,
        overwrite: OverwriteOpt = False, resume: ResumeOpt = False) -> None:
    from toolkit.unlearn.baselines import RmuConfig, run_rmu

    _unlearn("unlearn.rmu", RmuConfig, run_rmu,
             {**_train_flags(model, forget, retain, epochs, max_steps, lr, batch_size, max_length), "layer": layer},
             Common.of(locals()))


def _eval_flags(model, verbmem, forget_qa, retain_qa, holdout, retain, reference_model) -> dict:
    return {"model": model, "verbmem": verbmem, "forget_qa": forget_qa, "retain_qa": retain_qa, "holdout": holdout,
            "retain": retain, "reference_model": reference_model}


@app.command("eval", help="MUSE-style metrics: VerbMem, KnowMem, PrivLeak (Min-k%), utility ppl, jailbreak attacks.",
             epilog="Examples: iclrkit unlearn eval -m runs/prism/model --verbmem verbmem.json --forget-qa fqa.json "
                    "--retain-qa rqa.json --holdout holdout.json -r retain.json --reference-model zoo:gpt2-small")
def eval_(model: ModelOpt, verbmem: VerbmemOpt, forget_qa: ForgetQaOpt = None, retain_qa: RetainQaOpt = None,
          holdout: HoldoutOpt = None, retain: UtilityOpt = None, reference_model: ReferenceOpt = None,
          out: OutOpt = None, config: ConfigOpt = None, set_: SetOpt = None, seed: SeedOpt = None,
          device: DeviceOpt = None, dtype: DtypeOpt = None, dry_run: DryRunOpt = False,
          json_: JsonOpt = False, overwrite: OverwriteOpt = False) -> None:
    from toolkit.unlearn.evaluate import EvalConfig, run_eval

    execute(technique="unlearn.eval", config_cls=EvalConfig,
            flags=_eval_flags(model, verbmem, forget_qa, retain_qa, holdout, retain, reference_model),
            common=Common.of(locals()), run=run_eval, inputs={"verbmem": verbmem}, needs_out=False)


@app.command("relearn", help="Relearning attack: fine-tune on part of the forget set, then re-measure.",
             epilog="Examples: iclrkit unlearn relearn -m runs/prism/model -f forget.json --verbmem verbmem.json "
                    "--steps 100 -o runs/prism-relearn")
def relearn(model: ModelOpt, forget: ForgetOpt, verbmem: VerbmemOpt, forget_qa: ForgetQaOpt = None,
            retain_qa: RetainQaOpt = None, holdout: HoldoutOpt = None, retain: UtilityOpt = None,
            reference_model: ReferenceOpt = None,
            steps: Annotated[Optional[int], typer.Option(help="Fine-tuning steps.")] = None,
            fraction: Annotated[Optional[float], typer.Option(help="Share of the forget set used.")] = None,
            lr: LrOpt = None, batch_size: BatchOpt = None,
            out: OutOpt = None, config: ConfigOpt = None, set_: SetOpt = None, seed: SeedOpt = None,
            device: DeviceOpt = None, dtype: DtypeOpt = None, dry_run: DryRunOpt = False, json_: JsonOpt = False,
            overwrite: OverwriteOpt = False) -> None:
    from toolkit.unlearn.evaluate import RelearnConfig, run_relearn

    execute(technique="unlearn.relearn", config_cls=RelearnConfig,
            flags={**_eval_flags(model, verbmem, forget_qa, retain_qa, holdout, retain, reference_model),
                   "forget": forget, "steps": steps, "fraction": fraction, "lr": lr, "batch_size": batch_size},
            common=Common.of(locals()), run=run_relearn, inputs={"forget": forget, "verbmem": verbmem})
