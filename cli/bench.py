"""`iclrkit bench`: benchmark harnesses (VideoMathQA, MMSearch-Plus) with their official scoring.

Options come from the configs' fields (toolkit/bench/config.py): each knob is declared once, there."""

from __future__ import annotations

import inspect
from typing import Annotated, Optional

import typer

from cli._fields import STANDARD, config_command
from toolkit.bench.config import FixturesConfig, MMSearchConfig, VideoMathQAConfig

app = typer.Typer(no_args_is_help=True, help="Benchmark harnesses: VideoMathQA, MMSearch-Plus.")


def _on_cpu(*, common, **kwargs) -> None:
    """Writing the fixtures needs no accelerator: run on the CPU whatever --device the root command was given."""
    from cli._runner import execute

    common.device = "cpu"
    execute(common=common, **kwargs)


def _cot_or_direct(command) -> None:
    """The chain-of-thought switch keeps its lmms-eval spelling, --cot/--direct (the field's help stays)."""
    signature = inspect.signature(command)
    old = signature.parameters["cot"]
    help_text = next(meta.help for meta in old.annotation.__metadata__ if hasattr(meta, "help"))
    new = old.replace(annotation=Annotated[Optional[bool], typer.Option("--cot/--direct", help=help_text)])
    command.__signature__ = signature.replace(parameters=[new if p.name == "cot" else p
                                                          for p in signature.parameters.values()])
    command.__annotations__["cot"] = new.annotation


# name: (config, options besides the shared ones, help, epilog); run/plan live in toolkit/bench/NAME_run.py
HARNESSES = {
    "videomathqa": (
        VideoMathQAConfig, ["task", "cot", "subtitles", "frame_num", "judge_model", "extractor_model"],
        "VideoMathQA with the lmms-eval scoring: MCQ / multi-binary, direct or CoT, with or without subtitles; CoT "
        "step score with an LLM judge.",
        "Examples: iclrkit bench videomathqa -m openai:Qwen/Qwen2.5-VL-7B-Instruct@http://localhost:8000/v1 "
        "-d data/videomathqa --concurrency 8 -o runs/vmqa | iclrkit bench videomathqa -m zoo:smollm2-135m "
        "-d fx/videomathqa --task mbin --subtitles -o runs/vmqa-text"),
    "mmsearch": (
        MMSearchConfig, ["search", "modes", "max_rounds", "judge_model"],
        "MMSearch-Plus: decrypt the official rows, run the search agent in the paper's modes (no_search, "
        "image_search, rollout, rollout_som), judge the answers.",
        "Examples: iclrkit bench mmsearch -m openai:Qwen/Qwen2.5-VL-7B-Instruct@http://localhost:8000/v1 "
        "-d data/mmsearch_plus.jsonl --search http://localhost:9000 --concurrency 8 -o runs/mms | iclrkit bench "
        "mmsearch -m zoo:smollm2-135m -d fx/mmsearch --search offline:fx/mmsearch/corpus/pages.jsonl -o runs/mms"),
}

for _name, (_config, _flags, _help, _epilog) in HARNESSES.items():
    _command = config_command(
        app, _name, config=_config, run=f"toolkit.bench.{_name}_run:run_{_name}",
        plan=f"toolkit.bench.{_name}_run:plan_{_name}", technique=f"bench.{_name}", help=_help, epilog=_epilog,
        flags=["model", "data", *_flags, "limit", "concurrency"], common=(*STANDARD, "dtype"),
        inputs=lambda f: {"data": f["data"]})
    if "cot" in _flags:
        _cot_or_direct(_command)

config_command(
    app, "fixtures", config=FixturesConfig, run="toolkit.bench.fixtures_run:run_fixtures", technique="bench.fixtures",
    help="Write the synthetic VideoMathQA and MMSearch-Plus data (official formats) to --out.",
    epilog="Example: iclrkit bench fixtures -o fx", flags=["which"],
    common=tuple(name for name in STANDARD if name != "device"), execute_with=_on_cpu)
