"""run() for `iclrkit bench videomathqa`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from toolkit.bench import videomathqa as vm
from toolkit.bench.config import VideoMathQAConfig
from toolkit.bench.data import find_annotation, load_records, require_fields
from toolkit.core.errors import BadInputError, require

FIELDS = ("question_id", "videoID", "question", "options", "answer", "category", "length")


def resolve_paths(config: VideoMathQAConfig) -> tuple[Path, Path, Path]:
    stems = ("mcq",) if config.task == "mcq" else ("multi_binary", "mbin", "mcq")
    annotation = find_annotation(Path(config.data), stems)
    root = annotation.parent
    return (annotation, Path(config.video_dir) if config.video_dir else root / "videos",
            Path(config.subtitle_dir) if config.subtitle_dir else root / "subtitles")


def _steps(value):
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def validate_row(row: dict, source: Path) -> dict:
    options = row["options"]
    where = f"{source}: question {row['question_id']}"
    require(isinstance(options, list) and len(options) in (2, 5) and all(isinstance(o, str) for o in options),
            f"{where}: options must be a list of 2 or 5 strings")
    require(row["answer"] in vm.LETTERS[:len(options)], f"{where}: answer {row['answer']!r} is not an option letter")
    require(row["length"] in vm.VIDEO_LENGTHS, f"{where}: length {row['length']!r} is not short/medium/long")
    return {**row, "steps": _steps(row.get("steps"))}


def load_items(config: VideoMathQAConfig) -> tuple[list[dict], Path, Path]:
    annotation, videos, subtitles = resolve_paths(config)
    rows = load_records(annotation)
    require_fields(rows, FIELDS, annotation)
    rows = [validate_row(row, annotation) for row in rows]
    if config.limit:
        keep = set(list(dict.fromkeys(row["question_id"] for row in rows))[:config.limit])
        rows = [row for row in rows if row["question_id"] in keep]
    if config.task == "mbin":
        rows = [pair for row in rows for pair in (vm.binary_pairs(row) if len(row["options"]) == 5 else [row])]
    elif any(len(row["options"]) != 5 for row in rows):
        raise BadInputError(f"{annotation}: task mcq needs 5 options per question", "use --task mbin")
    return rows, videos, subtitles


def video_path(videos: Path, video_id: str) -> Path:
    for suffix in (".mp4", ".MP4", ".mkv"):
        if (videos / f"{video_id}{suffix}").is_file():
            return videos / f"{video_id}{suffix}"
    raise BadInputError(f"video {video_id} not found in {videos}")


def item_inputs(row: dict, config: VideoMathQAConfig, videos: Path, subtitles: Path, sees_images: bool):
    """(frames, subtitle text or None) for one row."""
    from toolkit.bench import video

    path = video_path(videos, row["videoID"])
    frames = video.sample_frames(path, config.frame_num)[0] if sees_images else []
    if not config.subtitles:
        return frames, None
    srt = subtitles / f"{row['videoID']}.srt"
    if not srt.is_file():
        return frames, ""
    total, fps = video.video_info(path)
    return frames, video.subtitles_for_frames(video.parse_srt(srt.read_text(encoding="utf-8")), fps, total,
                                              config.frame_num)


def plan_videomathqa(config: VideoMathQAConfig, ctx) -> dict:
    """--dry-run: the items that would be asked, without loading a model or decoding video."""
    rows, videos, subtitles = load_items(config)
    return {"rows": len(rows), "questions": len({row["question_id"] for row in rows}), "video_dir": str(videos),
            "subtitle_dir": str(subtitles) if config.subtitles else None,
            "max_new_tokens": config.max_new_tokens or (8096 if config.cot else 16),
            "step_judge": config.judge_model if config.cot else None}


# long: the benchmark's stages (answer, extract, judge) in order over the same rows and backends
def run_videomathqa(config: VideoMathQAConfig, ctx) -> dict:
    """Each stage (answers, CoT letter extraction, step judge) keeps up to its backend's `concurrency` requests in
    flight; rows are recorded in input order and the extractor's random fallback letters are drawn in that order
    too, so every concurrency gives the same predictions."""
    from toolkit.bench.vision import ModelPool, VisionModel
    from toolkit.llm.pool import ordered_map

    rows, videos, subtitles = load_items(config)
    pool = ModelPool(ctx.device, ctx.torch_dtype, config.cache_dir, config.request_timeout, config.concurrency)
    model = VisionModel(pool.get(config.model), use_images=config.use_images, max_side=config.image_max_side,
                        seed=ctx.seed)
    max_tokens = config.max_new_tokens or (8096 if config.cot else 16)
    extractor = pool.get(config.extractor_model or config.model) if config.cot else None
    judge = pool.get(config.judge_model) if config.cot and config.judge_model else None

    def answer(row: dict) -> str:
        frames, subtitle_text = item_inputs(row, config, videos, subtitles, model.sees_images)
        prompt = vm.build_prompt(row["question"], row["options"], config.cot, subtitle_text)
        return model.ask(prompt, frames, max_new_tokens=max_tokens)

    def extract(pair: tuple[dict, str]) -> str:
        row, response = pair
        return extractor.generate([vm.extraction_prompt(row["options"], response)], max_new_tokens=16,
                                  temperature=config.extractor_temperature, seed=ctx.seed, chat=True)[0].text

    def grade(pair: tuple[dict, str]) -> dict:
        row, response = pair
        reply = judge.generate([vm.step_judge_prompt(row["question"], row["options"], row["steps"], row["answer"],
                                                     response)],
                               max_new_tokens=config.judge_max_tokens, temperature=config.judge_temperature,
                               seed=ctx.seed, chat=True)[0].text
        return vm.parse_score_card(reply)

    def stage(function, items, llm, name: str) -> list:
        return list(ctx.progress(ordered_map(function, items, llm.concurrency), total=len(items), description=name))

    responses = stage(answer, rows, model.llm, "videomathqa")
    records = []
    for row, response in zip(rows, responses):
        record = {key: row[key] for key in ("question_id", "videoID", "category", "length", "answer", "pair",
                                            "reasoning_type") if key in row}
        record["response"] = response
        records.append(record)
    if config.cot:
        rng = np.random.default_rng(ctx.seed)
        replies = stage(extract, list(zip(rows, responses)), extractor, "videomathqa extract")
        for row, record, reply in zip(rows, records, replies):
            letter = vm.letter_of_reply(reply, row["options"], row["answer"], rng)
            record["extractor_reply"] = reply
            record["extractor_ok"] = vm.parse_extracted_letter(reply, len(row["options"])) is not None
            record["pred_answer"] = vm.extract_characters_regex(letter)
    else:
        for record in records:
            record["pred_answer"] = vm.extract_characters_regex(record["response"])
    if judge is not None:
        for record, card in zip(records, stage(grade, list(zip(rows, responses)), judge, "videomathqa judge")):
            record["score_card"] = card
    pool.close()
    return summarise(records, config, model.modality, ctx)


def summarise(records: list[dict], config: VideoMathQAConfig, modality: str, ctx) -> dict:
    table = vm.score_table(records, multi_binary=config.task == "mbin")
    metrics = {"variant": f"{config.task}{'_cot' if config.cot else ''}{'_w_subtitle' if config.subtitles else ''}",
               "modality": modality, **table}
    if config.cot:
        metrics["extractor_failures"] = sum(not r["extractor_ok"] for r in records)
    cards = [r for r in records if "score_card" in r]
    if cards:
        metrics["step_score"] = float(np.mean([r["score_card"]["score"] for r in cards]))
        metrics["step_score_judge_errors"] = sum(r["score_card"]["critique"] == "Error" for r in cards)
    with open(ctx.path("predictions.jsonl"), "w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record) + "\n")
    ctx.metrics.update(metrics)
    return metrics
