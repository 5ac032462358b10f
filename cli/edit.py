"""`iclrkit edit METHOD`: mass knowledge editing (MEMIT baseline and EAMET's embedding-aligned values).

One command per method registered in toolkit/edit/methods/, with the options its registration names. Options come
from the configs' fields (toolkit/edit/config.py): each knob is declared once, there — e.g. `--steps` is
MemitConfig.v_num_grad_steps and `--align-kl` EametConfig.cs_factor, named on the field itself."""

from __future__ import annotations

import typer

import toolkit.edit.config  # noqa: F401 - declares the registry's method modules (torch-free)
from cli._fields import STANDARD, config_command
from cli._runner import Common, execute
from toolkit.core.registry import registry

app = typer.Typer(no_args_is_help=True, help="Edit facts stored in a language model.")
COMMON = (*STANDARD, "dtype")


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


for _method in registry("edit"):
    config_command(
        app, _method.name, config=_method.config, run="toolkit.edit.run:run", plan="toolkit.edit.run:plan",
        technique=f"edit.{_method.name}", help=_method.meta["help"], epilog=_method.meta.get("epilog"),
        flags=_method.meta["flags"], common=COMMON, inputs=lambda f: {"model": f["model"], "data": f["data"]},
        execute_with=_execute_easyedit)
