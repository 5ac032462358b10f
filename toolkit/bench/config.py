"""The benchmark harnesses' configs (torch-free: the CLI builds `iclrkit bench` options from these fields)."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field

from toolkit.core.config import BaseConfig
from toolkit.llm.config import LLMClientConfig

CANARY = "MMSearch-Plus"  # the official encryption canary (the repository's name)
Mode = Literal["no_search", "image_search", "rollout", "rollout_som"]


def answering_model_field():
    return Field(description="openai:MODEL@http://host:port/v1 (vision server; images sent as base64) | local path | "
                             "zoo:NAME (text-only).", json_schema_extra={"short": "-m"})


class VideoMathQAConfig(LLMClientConfig):
    """VideoMathQA (https://arxiv.org/abs/2506.05349, data MBZUAI/VideoMathQA, project mbzuai-oryx/VideoMathQA;
    official scoring in EvolvingLMMs-Lab/lmms-eval `lmms_eval/tasks/videomathqa`).

    Defaults follow the lmms-eval task YAMLs: 32 frames, greedy decoding, 16 new tokens for direct answers and
    8096 for CoT; CoT letters mapped by an LLM (T 0.7, 16 tokens) with a random wrong letter on failure; the step
    judge samples at T 0.6 with up to 32768 tokens (upstream: Qwen3-4B in thinking mode)."""

    model: str = answering_model_field()
    data: str = Field(description="Annotation file or a directory with mcq.jsonl, videos/, subtitles/.",
                      json_schema_extra={"short": "-d"})
    video_dir: Optional[str] = None  # default: <data dir>/videos/<videoID>.mp4
    subtitle_dir: Optional[str] = None  # default: <data dir>/subtitles/<videoID>.srt
    # mbin from 5-way rows derives the correct-vs-distractor pairs
    task: Literal["mcq", "mbin"] = Field("mcq", description="Multiple choice or multi-binary.")
    # chain-of-thought prompt + LLM letter extraction (+ step score with judge_model); --direct is the off switch
    cot: bool = Field(False, description="Chain-of-thought prompt.")
    subtitles: bool = Field(False, description="Add subtitles (the _w_subtitle variants).")
    frame_num: int = Field(32, ge=-1, description="Frames per video (-1 = all).")
    max_new_tokens: Optional[int] = Field(None, ge=1)  # default 16 direct / 8096 CoT
    use_images: bool = True  # False (or a backend without vision) sends the text alone
    image_max_side: int = Field(768, ge=16)
    extractor_model: Optional[str] = Field(None, description="CoT letter extractor (default: --model).")
    extractor_temperature: float = Field(0.7, ge=0)
    judge_model: Optional[str] = Field(None, description="Step-score judge (CoT).")  # upstream Qwen3-4B thinking
    judge_temperature: float = Field(0.6, ge=0)
    judge_max_tokens: int = Field(32768, ge=1)
    limit: Optional[int] = Field(None, ge=1, description="First N questions.")
    request_timeout: float = Field(600.0, gt=0)
    cache_dir: Optional[str] = None  # disk cache of server replies (re-runs do not re-query)


class MMSearchConfig(LLMClientConfig):
    """MMSearch-Plus (https://arxiv.org/abs/2508.21475, data Cie1/MMSearch-Plus, repo mmsearch-plus/MMSearch-Plus).

    The paper evaluates four modes: without search; with the top-10 whole-image search results; a full rollout
    with text and image search (at most 20 rounds); and the rollout with Set-of-Mark (numbered marks, crops, and
    searches on the crops). The official agent, judge prompt and SoM boxes are unreleased: the agent and the
    SimpleQA-style judge here are ours, tasks without `som_boxes` get a 2×2 grid of marks, and results are
    labelled with the judge that produced them."""

    model: str = answering_model_field()
    data: str = Field(description="Rows file (.jsonl/.json/.parquet) or a directory with mmsearch_plus.jsonl.",
                      json_schema_extra={"short": "-d"})
    search: Optional[str] = Field(None, description="offline:CORPUS.jsonl | http(s)://search-service.")
    modes: list[Mode] = Field(["no_search", "image_search", "rollout", "rollout_som"],
                              description="Mode to run (repeatable; default all four).",
                              json_schema_extra={"flag": "--mode"})
    max_rounds: int = Field(20, ge=1, description="Tool rounds per task.")
    top_k: int = Field(10, ge=1)  # search results per call (the paper's image-search mode gives 10)
    max_observation_chars: int = Field(4000, ge=100)
    max_transcript_chars: int = Field(60000, ge=1000)
    time_limit_s: float = Field(600.0, gt=0)  # per task and mode
    max_new_tokens: int = Field(512, ge=1)
    judge_model: Optional[str] = Field(None, description="LLM judge (default: exact match).")
    canary: str = CANARY
    encrypted: bool = True  # False for rows that are already decrypted
    use_images: bool = True
    image_max_side: int = Field(768, ge=16)
    limit: Optional[int] = Field(None, ge=1, description="First N tasks.")
    log_plaintext: bool = False  # write decrypted questions/answers into predictions.jsonl
    request_timeout: float = Field(600.0, gt=0)
    cache_dir: Optional[str] = None


class FixturesConfig(BaseConfig):
    """Synthetic VideoMathQA and MMSearch-Plus data in the official formats (see toolkit/bench/fixtures.py)."""

    which: Literal["all", "videomathqa", "mmsearch"] = Field("all", description="Which data set to write.")
