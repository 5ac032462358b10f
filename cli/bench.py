"""`iclrkit bench`: benchmark harnesses (VideoMathQA, MMSearch-Plus) with their official scoring."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from cli._options import ConfigOpt, DeviceOpt, DryRunOpt, DtypeOpt, JsonOpt, OutOpt, OverwriteOpt, SeedOpt, SetOpt
from cli._runner import Common, execute

app = typer.Typer(no_args_is_help=True, help="Benchmark harnesses: VideoMathQA, MMSearch-Plus.")

LLMOpt = Annotated[str, typer.Option("--model", "-m", help="openai:MODEL@http://host:port/v1 (vision server; "
                                     "images sent as base64) | local path | zoo:NAME (text-only).")]


@app.command("videomathqa", help="VideoMathQA with the lmms-eval scoring: MCQ / multi-binary, direct or CoT, "
             "with or without subtitles; CoT step score with an LLM judge.",
             epilog="Examples: iclrkit bench videomathqa -m openai:Qwen/Qwen2.5-VL-7B-Instruct@http://localhost:8000/v1 "
                    "-d data/videomathqa -o runs/vmqa | iclrkit bench videomathqa -m zoo:smollm2-135m -d fx/videomathqa "
                    "--task mbin --subtitles -o runs/vmqa-text")
def videomathqa(
    model: LLMOpt,
    data: Annotated[Optional[str], typer.Option("--data", "-d", help="Annotation file or a directory with "
                                                "mcq.jsonl, videos/, subtitles/.")] = None,
    task: Annotated[Optional[str], typer.Option(help="mcq | mbin.")] = None,
    cot: Annotated[Optional[bool], typer.Option("--cot/--direct", help="Chain-of-thought prompt.")] = None,
    subtitles: Annotated[Optional[bool], typer.Option("--subtitles/--no-subtitles", help="Add subtitles.")] = None,
    frame_num: Annotated[Optional[int], typer.Option(help="Frames per video (-1 = all).")] = None,
    judge_model: Annotated[Optional[str], typer.Option(help="Step-score judge (CoT).")] = None,
    extractor_model: Annotated[Optional[str], typer.Option(help="CoT letter extractor (default: --model).")] = None,
    limit: Annotated[Optional[int], typer.Option(help="First N questions.")] = None,
    out: OutOpt = None, config: ConfigOpt = None, set_: SetOpt = None, seed: SeedOpt = None,
    device: DeviceOpt = None, dtype: DtypeOpt = None, dry_run: DryRunOpt = False, json_: JsonOpt = False,
    overwrite: OverwriteOpt = False,
) -> None:
    from toolkit.bench.videomathqa_run import VideoMathQAConfig, plan_videomathqa, run_videomathqa

    execute(technique="bench.videomathqa", config_cls=VideoMathQAConfig,
            flags={"model": model, "data": data, "task": task, "cot": cot, "subtitles": subtitles,
                   "frame_num": frame_num, "judge_model": judge_model, "extractor_model": extractor_model,
                   "limit": limit},
            common=Common.of(locals()), run=run_videomathqa, plan=plan_videomathqa, inputs={"data": data})


@app.command("mmsearch", help="MMSearch-Plus: decrypt the official rows, run the search agent in the paper's "
             "modes (no_search, image_search, rollout, rollout_som), judge the answers.",
             epilog="Examples: iclrkit bench mmsearch -m openai:Qwen/Qwen2.5-VL-7B-Instruct@http://localhost:8000/v1 "
                    "-d data/mmsearch_plus.jsonl --search http://localhost:9000 -o runs/mms | iclrkit bench mmsearch "
                    "-m zoo:smollm2-135m -d fx/mmsearch --search offline:fx/mmsearch/corpus/pages.jsonl -o runs/mms")
def mmsearch(
    model: LLMOpt,
    data: Annotated[Optional[str], typer.Option("--data", "-d", help="Rows file (.jsonl/.json/.parquet) or a "
                                                "directory with mmsearch_plus.jsonl.")] = None,
    search: Annotated[Optional[str], typer.Option(help="offline:CORPUS.jsonl | http(s)://search-service.")] = None,
    mode: Annotated[Optional[list[str]], typer.Option(help="Mode to run (repeatable; default all four).")] = None,
    max_rounds: Annotated[Optional[int], typer.Option(help="Tool rounds per task.")] = None,
    judge_model: Annotated[Optional[str], typer.Option(help="LLM judge (default: exact match).")] = None,
    limit: Annotated[Optional[int], typer.Option(help="First N tasks.")] = None,
    out: OutOpt = None, config: ConfigOpt = None, set_: SetOpt = None, seed: SeedOpt = None,
    device: DeviceOpt = None, dtype: DtypeOpt = None, dry_run: DryRunOpt = False, json_: JsonOpt = False,
    overwrite: OverwriteOpt = False,
) -> None:
    from toolkit.bench.mmsearch_run import MMSearchConfig, plan_mmsearch, run_mmsearch

    execute(technique="bench.mmsearch", config_cls=MMSearchConfig,
            flags={"model": model, "data": data, "search": search, "modes": mode or None, "max_rounds": max_rounds,
                   "judge_model": judge_model, "limit": limit},
            common=Common.of(locals()), run=run_mmsearch, plan=plan_mmsearch, inputs={"data": data})


@app.command("fixtures", help="Write the synthetic VideoMathQA and MMSearch-Plus data (official formats) to --out.",
             epilog="Example: iclrkit bench fixtures -o fx")
def fixtures(
    which: Annotated[Optional[str], typer.Option(help="all | videomathqa | mmsearch.")] = None,
    out: OutOpt = None, config: ConfigOpt = None, set_: SetOpt = None, seed: SeedOpt = None,
    dry_run: DryRunOpt = False, json_: JsonOpt = False, overwrite: OverwriteOpt = False,
) -> None:
    from toolkit.bench.fixtures_run import FixturesConfig, run_fixtures

    execute(technique="bench.fixtures", config_cls=FixturesConfig, flags={"which": which},
            common=Common.of(locals(), device="cpu"), run=run_fixtures)
