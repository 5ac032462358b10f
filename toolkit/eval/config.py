"""The configs of `iclrkit eval ppl | tasks` (torch-free, so the CLI builds their options from the fields)."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field, model_validator

from toolkit.core.config import BaseConfig
from toolkit.core.fields import data_field, model_field, onload_field


class PerplexityConfig(BaseConfig):
    """Perplexity of a causal LM on a text source (strided windows, the Hugging Face protocol)."""

    model: str = model_field()
    data: Optional[str] = data_field()
    max_length: int = Field(512, gt=1, description="Window length in tokens.")
    stride: Optional[int] = Field(None, ge=1, description="Stride between windows (default: max length).")
    max_windows: Optional[int] = Field(None, ge=1, description="Score only the first N windows.")
    split: Optional[Literal["train", "test"]] = Field(None, description="The zoo's 95/5 paragraph split of the data "
                                                                        "(seed 0).")
    onload: bool = onload_field()

    @model_validator(mode="after")
    def _stride_within_window(self) -> "PerplexityConfig":
        if self.stride is not None and self.stride > self.max_length:
            raise ValueError(f"--stride {self.stride} is longer than --max-length {self.max_length}: tokens between "
                             "windows would never be scored")
        return self


class TasksConfig(BaseConfig):
    """Zero-/few-shot tasks of lm-evaluation-harness on one model."""

    model: str = model_field()
    tasks: str = Field(description="Comma-separated lm-eval task or group names.")
    include_path: str | None = Field(None, description="Folder of local task YAMLs (searched before the built-in "
                                                       "tasks).")
    data_root: str | None = Field(None, description="Data root for local tasks' custom_dataset functions (default: "
                                                    "$ICLRKIT_DATA).")
    limit: int | None = Field(None, gt=0, description="Evaluate only the first N documents per task.")
    num_fewshot: int | None = Field(None, ge=0, description="Few-shot examples (default: the task's).")
    batch_size: int = Field(8, gt=0, description="Requests per forward pass.")
    max_length: int | None = Field(None, gt=1)  # context cap (default: the model's)
    bootstrap_iters: int = Field(1000, ge=0)  # for the standard errors; 0 = none
