"""iclrkit root command. Families are added when their module exists; nothing heavy is imported at top."""

from __future__ import annotations

import importlib
import importlib.util
import os
from typing import Annotated, Optional

import typer

from cli._runner import ROOT_STATE

app = typer.Typer(name="iclrkit", no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="ICLR 2026 techniques as tools for your own models and data.",
                  epilog="Examples: iclrkit info | iclrkit zoo build gpt2-small | "
                         "iclrkit eval ppl --model zoo:gpt2-small --data embedded")

# (module in cli/, command name); a family is listed only once its module exists.
FAMILIES = (
    ("compress", "compress"), ("remove_ln", "remove-ln"), ("merge", "merge"), ("edit", "edit"),
    ("unlearn", "unlearn"), ("steer", "steer"), ("defend", "defend"), ("explain", "explain"),
    ("cluster", "cluster"), ("segment", "segment"), ("rag", "rag"), ("bench", "bench"), ("prompt", "prompt"),
    ("uq", "uq"), ("study", "study"), ("causal", "causal"), ("export", "export"),
)


BROKEN_FAMILIES: dict[str, str] = {}


def _version(value: bool) -> None:
    if value:
        from toolkit import __version__

        typer.echo(f"iclrkit {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: Annotated[Optional[bool], typer.Option("--version", callback=_version, is_eager=True,
                                                    help="Print the version and exit.")] = None,
    verbose: Annotated[int, typer.Option("-v", "--verbose", count=True, help="More logging (-vv: tracebacks).")] = 0,
    quiet: Annotated[bool, typer.Option("-q", "--quiet", help="Only errors; no progress bars.")] = False,
    device: Annotated[Optional[str], typer.Option("--device", help="Default device: auto | cpu | cuda[:N].")] = None,
    seed: Annotated[Optional[int], typer.Option("--seed", help="Default seed for every command.")] = None,
    offline: Annotated[bool, typer.Option("--offline", help="Never touch the network (sets HF_HUB_OFFLINE=1).")] = False,
) -> None:
    from toolkit.core.context import setup_logging

    ROOT_STATE.update(device=device, seed=seed, verbosity=-1 if quiet else verbose, offline=offline)
    setup_logging(ROOT_STATE["verbosity"])
    if offline:
        os.environ["HF_HUB_OFFLINE"] = "1"
        os.environ["TRANSFORMERS_OFFLINE"] = "1"


def _register_families() -> None:
    from cli import eval as eval_cli
    from cli import info as info_cli
    from cli import zoo as zoo_cli

    app.command("info", help="Versions, devices, compiled kernels, optional packages, cache dirs.")(info_cli.info)
    app.add_typer(zoo_cli.app, name="zoo")
    app.add_typer(eval_cli.app, name="eval")
    for module, name in FAMILIES:
        if importlib.util.find_spec(f"cli.{module}") is None:
            continue
        try:
            family = importlib.import_module(f"cli.{module}")
        except Exception as exc:  # noqa: BLE001 - a broken family must not take the whole CLI down
            BROKEN_FAMILIES[name] = f"{type(exc).__name__}: {exc}"
            continue
        app.add_typer(family.app, name=name)


_register_families()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
