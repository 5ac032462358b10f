"""`iclrkit edit memit|eamet`: mass knowledge editing (MEMIT baseline and EAMET's embedding-aligned values)."""

from __future__ import annotations

from typing import Annotated

import typer

from cli._options import (
    ConfigOpt,
    DeviceOpt,
    DryRunOpt,
    DtypeOpt,
    JsonOpt,
    OutOpt,
    OverwriteOpt,
    SeedOpt,
    SetOpt,
)
from cli._runner import Common, execute

app = typer.Typer(no_args_is_help=True, help="Edit facts stored in a language model.")

FactsOpt = Annotated[str, typer.Option("--data", "-d", help="Facts: CounterFact/zsRE .json (ROME or EasyEdit "
                                                             "schema) or .jsonl {prompt, subject, target_new}.")]
NEditsOpt = Annotated[int | None, typer.Option("--n-edits", "-n", help="Edit the first N facts (default: all).")]
LayersOpt = Annotated[str | None, typer.Option("--layers", help="Edit layers, comma separated, e.g. 3,4.")]
BatchOpt = Annotated[int | None, typer.Option("--batch-size", help="Sequential batched editing: facts per "
                                                                      "update (default: all in one update).")]
LambdaOpt = Annotated[float | None, typer.Option("--mom2-weight", help="λ of the covariance term.")]
CovOpt = Annotated[str | None, typer.Option("--cov-data", help="Text for the key covariance (default: embedded).")]
StepsOpt = Annotated[int | None, typer.Option("--steps", help="Value optimisation steps per fact.")]
ValuesOpt = Annotated[str | None, typer.Option("--values", help="Reuse the δ of an earlier run (its out dir or "
                                                                 "values.safetensors; same model, facts, layers): "
                                                                 "redo only the insertion, e.g. to sweep λ.")]


EditModelOpt = Annotated[str | None, typer.Option("--model", "-m", help="Model: local path, hub id, or zoo:NAME "
                                                                         "(default: an EasyEdit --config's "
                                                                         "model_name).")]


def _edit(technique: str, config_cls, run, plan, flags: dict, common: Common) -> None:
    """`--config` may be an EasyEdit hparams YAML (it has `alg_name`): translated to this command's keys."""
    import tempfile
    from pathlib import Path

    translated = _easyedit(common, technique.split(".")[-1])
    try:
        if translated is not None:
            import yaml

            with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as handle:
                yaml.safe_dump(translated, handle)
            common.extra_inputs["hparams"] = str(common.config)
            common.config = Path(handle.name)
        execute(technique=technique, config_cls=config_cls, flags=flags, common=common, run=run,
                inputs={"model": flags["model"], "data": flags["data"]}, plan=plan)
    finally:
        if translated is not None:
            common.config.unlink(missing_ok=True)


def _easyedit(common: Common, command: str) -> dict | None:
    """The iclrkit keys of an EasyEdit hparams --config, None for a plain iclrkit config; bad files exit 2."""
    from cli._runner import fail
    from toolkit.core.errors import IclrkitError

    if common.config is None:
        return None
    try:
        from toolkit.core.config import load_yaml
        from toolkit.edit.easyedit import is_easyedit, translate_file

        if not is_easyedit(load_yaml(common.config)):
            return None
        return translate_file(common.config, command)[0]
    except IclrkitError as exc:
        fail(exc)


@app.command("memit", help="MEMIT: closed-form multi-layer insertion of many facts at once.",
             epilog="Examples: iclrkit edit memit -m zoo:smollm2-135m -d zsre_mend_train-1k.json -n 100 -o runs/memit "
                    "| iclrkit edit memit -m ./gpt2 -d facts.jsonl --layers 3,4 --batch-size 100 -o out | "
                    "iclrkit edit memit -m ./gpt2-xl -d knowedit.json --config EasyEdit/hparams/MEMIT/gpt2-xl.yaml "
                    "-o out")
def memit(data: FactsOpt, model: EditModelOpt = None, n_edits: NEditsOpt = None, layers: LayersOpt = None,
          batch_size: BatchOpt = None, mom2_weight: LambdaOpt = None, cov_data: CovOpt = None,
          steps: StepsOpt = None, values: ValuesOpt = None, out: OutOpt = None, config: ConfigOpt = None,
          set_: SetOpt = None, seed: SeedOpt = None, device: DeviceOpt = None, dtype: DtypeOpt = None,
          dry_run: DryRunOpt = False, json_: JsonOpt = False, overwrite: OverwriteOpt = False) -> None:
    from toolkit.edit.memit import MemitConfig, plan, run_memit

    _edit("edit.memit", MemitConfig, run_memit, plan,
          {"model": model, "data": data, "n_edits": n_edits, "layers": layers, "batch_size": batch_size,
           "mom2_update_weight": mom2_weight, "cov_data": cov_data, "v_num_grad_steps": steps, "values": values},
          Common.of(locals()))


@app.command("eamet", help="EAMET: MEMIT whose values are aligned with the key similarity structure.",
             epilog="Examples: iclrkit edit eamet -m zoo:smollm2-135m -d zsre_mend_train-1k.json -n 1000 -o runs/eamet "
                    "| iclrkit edit eamet -m ./llama -d counterfact.json --set cs_factor=0 --set mse_factor=0 -o out")
def eamet(data: FactsOpt, model: EditModelOpt = None, n_edits: NEditsOpt = None, layers: LayersOpt = None,
          batch_size: BatchOpt = None, mom2_weight: LambdaOpt = None, cov_data: CovOpt = None,
          steps: StepsOpt = None, values: ValuesOpt = None,
          tau: Annotated[float | None, typer.Option(help="Softmax temperature of the similarities.")] = None,
          top_m: Annotated[int | None, typer.Option(help="Key neighbours in the weighted MSE.")] = None,
          align_kl: Annotated[float | None, typer.Option(help="Weight of KL(P_k ‖ P_r) (cs_factor).")] = None,
          align_mse: Annotated[float | None, typer.Option(help="Weight of the weighted MSE (mse_factor).")] = None,
          out: OutOpt = None, config: ConfigOpt = None, set_: SetOpt = None, seed: SeedOpt = None,
          device: DeviceOpt = None, dtype: DtypeOpt = None, dry_run: DryRunOpt = False, json_: JsonOpt = False,
          overwrite: OverwriteOpt = False) -> None:
    from toolkit.edit.eamet import EametConfig, run_eamet
    from toolkit.edit.memit import plan

    _edit("edit.eamet", EametConfig, run_eamet, plan,
          {"model": model, "data": data, "n_edits": n_edits, "layers": layers, "batch_size": batch_size,
           "mom2_update_weight": mom2_weight, "cov_data": cov_data, "v_num_grad_steps": steps, "values": values,
           "tau": tau, "top_m": top_m, "cs_factor": align_kl, "mse_factor": align_mse},
          Common.of(locals()))
