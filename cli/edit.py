"""`iclrkit edit memit|eamet`: mass knowledge editing (MEMIT baseline and EAMET's embedding-aligned values).

Options come from the configs' fields (toolkit/edit/config.py): each knob is declared once, there — e.g. `--steps`
is MemitConfig.v_num_grad_steps and `--align-kl` EametConfig.cs_factor, named on the field itself."""

from __future__ import annotations

import typer

from cli._fields import STANDARD, config_command
from cli._runner import Common, execute
from toolkit.edit.config import EametConfig, MemitConfig

app = typer.Typer(no_args_is_help=True, help="Edit facts stored in a language model.")
COMMON = (*STANDARD, "dtype")
FLAGS = ["data", "model", "n_edits", "layers", "batch_size", "mom2_update_weight", "cov_data", "v_num_grad_steps",
         "values"]


def _execute_easyedit(*, common: Common, **kwargs) -> None:
    """`--config` may be an EasyEdit hparams YAML (it has `alg_name`): translated to this command's keys."""
    import tempfile
    from pathlib import Path

    translated = _easyedit(common, kwargs["technique"].split(".")[-1])
    try:
        if translated is not None:
            import yaml

            with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as handle:
                yaml.safe_dump(translated, handle)
            common.extra_inputs["hparams"] = str(common.config)
            common.config = Path(handle.name)
        execute(common=common, **kwargs)
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


config_command(
    app, "memit", config=MemitConfig, run="toolkit.edit.memit:run_memit", plan="toolkit.edit.memit:plan",
    technique="edit.memit", help="MEMIT: closed-form multi-layer insertion of many facts at once.",
    epilog="Examples: iclrkit edit memit -m zoo:smollm2-135m -d zsre_mend_train-1k.json -n 100 -o runs/memit | "
           "iclrkit edit memit -m ./gpt2 -d facts.jsonl --layers 3,4 --batch-size 100 -o out | "
           "iclrkit edit memit -m ./gpt2-xl -d knowedit.json --config EasyEdit/hparams/MEMIT/gpt2-xl.yaml -o out",
    flags=FLAGS, common=COMMON, inputs=lambda f: {"model": f["model"], "data": f["data"]},
    execute_with=_execute_easyedit)

config_command(
    app, "eamet", config=EametConfig, run="toolkit.edit.eamet:run_eamet", plan="toolkit.edit.memit:plan",
    technique="edit.eamet", help="EAMET: MEMIT whose values are aligned with the key similarity structure.",
    epilog="Examples: iclrkit edit eamet -m zoo:smollm2-135m -d zsre_mend_train-1k.json -n 1000 -o runs/eamet | "
           "iclrkit edit eamet -m ./llama -d counterfact.json --set cs_factor=0 --set mse_factor=0 -o out",
    flags=[*FLAGS, "tau", "top_m", "cs_factor", "mse_factor"], common=COMMON,
    inputs=lambda f: {"model": f["model"], "data": f["data"]}, execute_with=_execute_easyedit)
