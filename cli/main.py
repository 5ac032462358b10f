"""iclrkit root command. Families are added when their module exists; nothing heavy is imported at top."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from typing import Annotated, Optional

import typer

from cli._options import check_seed
from cli._runner import ROOT_STATE

app = typer.Typer(name="iclrkit", no_args_is_help=True, add_completion=True, pretty_exceptions_enable=False,
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
    seed: Annotated[Optional[int], typer.Option("--seed", callback=check_seed,
                                                help="Default seed for every command.")] = None,
    offline: Annotated[bool, typer.Option("--offline", help="Never touch the network (sets HF_HUB_OFFLINE=1).")] = False,
    threads: Annotated[Optional[int], typer.Option("--threads", help="CPU threads for torch (default: "
                                                   "ICLRKIT_THREADS, else torch's default, one per core).")] = None,
    force: Annotated[bool, typer.Option("--force", help="With --overwrite: also replace a non-empty --out that is "
                                                        "not an iclrkit output (no run.json).")] = False,
) -> None:
    from cli._runner import fail, parse_threads
    from toolkit.core.context import setup_logging

    try:
        parse_threads(threads, "--threads")
    except Exception as exc:  # noqa: BLE001 - one line, exit 2
        fail(exc)
    ROOT_STATE.update(device=device, seed=seed, verbosity=-1 if quiet else verbose, offline=offline,
                      threads=threads, force=force)
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
            app.add_typer(broken_family(name, BROKEN_FAMILIES[name]), name=name)
            continue
        app.add_typer(family.app, name=name)


def broken_family(name: str, error: str) -> typer.Typer:
    """Stands in for a family whose module failed to import: any use says why (exit 1) instead of 'No such
    command'; `iclrkit info` lists it too."""
    from typer.core import TyperGroup

    message = f"error: the '{name}' commands failed to import: {error} (see `iclrkit info`)"

    def refuse(*_args, **_kwargs) -> None:
        typer.echo(message, err=True)
        raise typer.Exit(1)

    class Unavailable(TyperGroup):
        def get_command(self, ctx, cmd_name):
            import click

            return click.Command(cmd_name, callback=refuse, add_help_option=False,
                                 context_settings={"ignore_unknown_options": True, "allow_extra_args": True})

        def list_commands(self, ctx):
            return []

    stub = typer.Typer(cls=Unavailable, help=f"(unavailable: failed to import: {error})", add_completion=False)
    stub.callback(invoke_without_command=True)(lambda: refuse())
    return stub


_register_families()


def _flags_without_metavar() -> None:
    """Boolean flags and counters are shown as flags in --help, not with a `<bool>` type."""
    from typer.core import TyperOption

    if getattr(TyperOption.display_type_rich, "iclrkit", False):
        return
    original = TyperOption.display_type_rich

    def display_type_rich(self, ctx):
        if (self.is_flag or self.count) and self.metavar is None:
            return None
        return original(self, ctx)

    display_type_rich.iclrkit = True
    TyperOption.display_type_rich = display_type_rich


_flags_without_metavar()

# Root options that may also be typed after the subcommand; value-taking ones list True.
MOVABLE = {"-q": False, "--quiet": False, "-v": False, "--verbose": False, "--offline": False, "--force": False,
           "--threads": True}


_ROOT_COMMAND: list = []


def root_command():
    """The Click command of the whole app, built once per process (building it walks every family: ~0.15 s)."""
    if not _ROOT_COMMAND:
        _ROOT_COMMAND.append(typer.main.get_command(app))
    return _ROOT_COMMAND[0]


def _leaf_options(args: list[str], command=None):
    """(index where the leaf command's own arguments start, the names of its options) for `args`."""
    command = command if command is not None else root_command()
    index = 0
    root_values = {name for param in command.params if param.param_type_name == "option" and not param.is_flag
                   and not param.count for name in param.opts}
    root = command
    while isinstance(getattr(command, "commands", None), dict) and index < len(args):
        token = args[index]
        index_is_root = command is root
        if token in command.commands:
            command = command.commands[token]
            index += 1
        elif token.startswith("-"):
            index += 2 if (index_is_root and token in root_values) else 1
        else:
            return index, None
    if isinstance(getattr(command, "commands", None), dict):
        return index, None
    names = {name for param in command.params for name in (*param.opts, *param.secondary_opts)}
    return index, names


def move_root_options(args: list[str], command=None) -> list[str]:
    """`iclrkit eval ppl ... -q --offline` == `iclrkit -q --offline eval ppl ...`: root options the leaf command does
    not define itself are moved in front of the subcommand (nothing after `--` is touched)."""
    start, own = _leaf_options(args, command)
    if own is None or start == 0:
        return args
    moved, kept = [], list(args[:start])
    tail = args[start:]
    i = 0
    while i < len(tail):
        token = tail[i]
        if token == "--":
            kept.extend(tail[i:])
            break
        name = token.split("=", 1)[0]
        counted = len(token) > 2 and token.startswith("-v") and set(token[1:]) == {"v"}
        if (name in MOVABLE or counted) and name not in own and not (counted and "-v" in own):
            takes_value = MOVABLE.get(name, False) and "=" not in token
            moved.extend(tail[i:i + 2] if takes_value else [token])
            i += 2 if takes_value else 1
            continue
        kept.append(token)
        i += 1
    return moved + kept


def main(argv: list[str] | None = None) -> None:
    """The console script: root options anywhere, usage errors as one line (exit 2), then the command's exit code."""
    try:  # typer >= 0.2x vendors click as typer._click; older ones use click itself
        from typer._click import exceptions
    except ImportError:  # pragma: no cover
        from click import exceptions
    no_args = getattr(exceptions, "NoArgsIsHelpError", ())

    command = root_command()
    args = move_root_options(list(sys.argv[1:] if argv is None else argv), command)
    try:
        code = command.main(args=args, prog_name="iclrkit", standalone_mode=False)
    except no_args as exc:
        typer.echo(exc.ctx.get_help() if exc.ctx else "", err=False)
        sys.exit(2)
    except exceptions.UsageError as exc:
        where = exc.ctx.command_path if exc.ctx else "iclrkit"
        typer.echo(f"error: {exc.format_message()} (see: {where} --help)", err=True)
        sys.exit(2)
    except exceptions.ClickException as exc:
        typer.echo(f"error: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code)
    except typer.Abort:
        typer.echo("error: interrupted", err=True)
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
