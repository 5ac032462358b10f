"""`iclrkit eval ppl|tasks`: shared evaluators every recipe reuses (perplexity; lm-evaluation-harness tasks)."""

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
    SeedOpt,
    SetOpt,
)
from cli._runner import Common, execute

app = typer.Typer(no_args_is_help=True, help="Evaluate models.")


@app.command("ppl", help="Perplexity on text with strided windows.",
             epilog="Examples: iclrkit eval ppl --model zoo:gpt2-small --data embedded | "
                    "iclrkit eval ppl -m ./my-model -d test.txt --max-length 1024 --stride 512 --json")
def ppl(
    model: ModelOpt,
    data: DataOpt = None,
    max_length: Annotated[int, typer.Option(help="Window length in tokens.")] = None,
    stride: Annotated[int, typer.Option(help="Stride between windows (default: max length).")] = None,
    max_windows: Annotated[int, typer.Option(help="Score only the first N windows.")] = None,
    split: Annotated[str, typer.Option(help="train | test: the zoo's 95/5 paragraph split of the data.")] = None,
    out: OutOpt = None, config: ConfigOpt = None, set_: SetOpt = None, seed: SeedOpt = None,
    device: DeviceOpt = None, dtype: DtypeOpt = None, dry_run: DryRunOpt = False, json_: JsonOpt = False,
    overwrite: OverwriteOpt = False,
) -> None:
    from toolkit.eval.run import PerplexityConfig, run_perplexity

    execute(technique="eval.ppl", config_cls=PerplexityConfig,
            flags={"model": model, "data": data, "max_length": max_length, "stride": stride,
                   "max_windows": max_windows, "split": split},
            common=Common.of(locals()),
            run=run_perplexity, inputs={"data": data}, needs_out=False)


@app.command("tasks", help="lm-evaluation-harness tasks (zero-/few-shot) through its Python API; a packed/ model runs "
             "with its activation/KV fake quantization, as its perplexity was measured.",
             epilog="Examples: iclrkit eval tasks -m runs/obr/packed --tasks iclrkit_sst2,iclrkit_counterfact "
                    "--include-path examples/lmeval/tasks --data-root ../shared/data --out runs/obr-tasks | "
                    "iclrkit eval tasks -m zoo:smollm2-135m --tasks iclrkit_zeroshot --include-path "
                    "examples/lmeval/tasks --limit 100 --json")
def tasks(
    model: ModelOpt,
    tasks_: Annotated[str, typer.Option("--tasks", help="Comma-separated lm-eval task or group names.")],
    include_path: Annotated[str | None, typer.Option(help="Folder of local task YAMLs.")] = None,
    data_root: Annotated[str | None, typer.Option(help="Data root for local tasks (default: $ICLRKIT_DATA).")] = None,
    limit: Annotated[int | None, typer.Option(help="Evaluate only the first N documents per task.")] = None,
    num_fewshot: Annotated[int | None, typer.Option(help="Few-shot examples (default: the task's).")] = None,
    batch_size: Annotated[int | None, typer.Option(help="Requests per forward pass.")] = None,
    out: OutOpt = None, config: ConfigOpt = None, set_: SetOpt = None, seed: SeedOpt = None,
    device: DeviceOpt = None, dtype: DtypeOpt = None, dry_run: DryRunOpt = False, json_: JsonOpt = False,
    overwrite: OverwriteOpt = False,
) -> None:
    from toolkit.eval.lmeval import TasksConfig, run_tasks

    execute(technique="eval.tasks", config_cls=TasksConfig,
            flags={"model": model, "tasks": tasks_, "include_path": include_path, "data_root": data_root,
                   "limit": limit, "num_fewshot": num_fewshot, "batch_size": batch_size},
            common=Common.of(locals()), run=run_tasks, inputs={"include_path": include_path}, needs_out=False)
