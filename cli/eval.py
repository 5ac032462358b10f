"""`iclrkit eval ppl|tasks`: shared evaluators every recipe reuses (perplexity; lm-evaluation-harness tasks).

Options come from the configs' fields (toolkit/eval/config.py): each knob is declared once, there."""

from __future__ import annotations

import inspect
import typing
from typing import Annotated

import typer

from cli._fields import STANDARD, config_command
from toolkit.eval.config import PerplexityConfig, TasksConfig

app = typer.Typer(no_args_is_help=True, help="Evaluate models.")
COMMON = (*STANDARD, "dtype")


def _required_when_parsed(command, config: type, name: str) -> None:
    """Make the generated `--NAME` a Click-required option (exit 2 "Missing option '--NAME'" before anything runs),
    as this command's --model always was, instead of a key --config/--set may also supply."""
    signature = inspect.signature(command)
    params = []
    for param in signature.parameters.values():
        if param.name == name:
            kind, info = typing.get_args(param.annotation)
            info.help = config.model_fields[name].description
            param = param.replace(default=inspect.Parameter.empty,
                                  annotation=Annotated[typing.get_args(kind)[0], info])
            command.__annotations__[name] = param.annotation
        params.append(param)
    command.__signature__ = signature.replace(parameters=params)


ppl = config_command(
    app, "ppl", config=PerplexityConfig, run="toolkit.eval.run:run_perplexity", technique="eval.ppl",
    plan="toolkit.eval.run:plan_perplexity",
    help="Perplexity on text with strided windows.",
    epilog="Examples: iclrkit eval ppl --model zoo:gpt2-small --data embedded | "
           "iclrkit eval ppl -m ./my-model -d test.txt --max-length 1024 --stride 512 --json | "
           "iclrkit eval ppl -m ./big-model -d test.txt --set onload=true (one block in memory; --dry-run plans it)",
    flags=["model", "data", "max_length", "stride", "max_windows", "split"], common=COMMON,
    inputs=lambda f: {"data": f["data"]}, needs_out=False, optional_out=True)
_required_when_parsed(ppl, PerplexityConfig, "model")

config_command(
    app, "tasks", config=TasksConfig, run="toolkit.eval.lmeval:run_tasks", technique="eval.tasks",
    help="lm-evaluation-harness tasks (zero-/few-shot) through its Python API; a packed/ model runs with its "
         "activation/KV fake quantization, as its perplexity was measured.",
    epilog="Examples: iclrkit eval tasks -m runs/obr/packed --tasks iclrkit_sst2,iclrkit_counterfact "
           "--include-path examples/lmeval/tasks --data-root ../shared/data --out runs/obr-tasks | "
           "iclrkit eval tasks -m zoo:smollm2-135m --tasks iclrkit_zeroshot --include-path "
           "examples/lmeval/tasks --limit 100 --json",
    flags=["model", "tasks", "include_path", "data_root", "limit", "num_fewshot", "batch_size"], common=COMMON,
    inputs=lambda f: {"include_path": f["include_path"]}, needs_out=False, optional_out=True)
