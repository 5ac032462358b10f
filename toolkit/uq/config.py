"""The config of `iclrkit uq tokur` (torch-free, so the CLI builds its options from the fields)."""

from __future__ import annotations

import math
from typing import Annotated, Literal, Optional, Union

from pydantic import Field, field_validator

from toolkit.core.config import BaseConfig
from toolkit.core.fields import data_field, model_field


class TokURConfig(BaseConfig):
    """TokUR (https://arxiv.org/abs/2505.11737, code Wang-ML-Lab/TokUR).

    The rank, M and the module set are ours (the notes could not confirm the paper's): rank 8, M = 5, all attention
    projections; σ = "auto" runs the TFB binary search (≤ 1% NLL change, 10 iterations)."""

    model: str = model_field()
    # GSM8K ("question", "answer" ending in "#### N"), MATH ("problem", "solution" with \boxed{…}, optional bare
    # "answer"), MetaMath ("query", "response" ending "The answer is: …")
    data: str = data_field(..., description="Math problems: JSONL of GSM8K, MATH or MetaMath records.")
    prompt_template: str = "Question: {question}\nAnswer:"
    limit: Optional[int] = Field(None, ge=1, description="Use the first N questions.")
    candidates: int = Field(4, ge=1, description="Responses per question (best-of-N).")
    temperature: float = Field(1.0, gt=0)
    max_new_tokens: int = Field(64, ge=1, description="Response length cap.")
    generate_batch: int = Field(1, ge=1, description="Questions sampled in one generate call (faster on CPU). "
                                "Each keeps its seed: the responses of 1, unless the left padding moves a logit's "
                                "last bits enough to change a sampled token (rare).")
    samples: int = Field(5, ge=1, description="M perturbed models scoring each response.")
    rank: int = Field(8, ge=1, description="Rank of the weight perturbation.")
    sigma: Union[Annotated[float, Field(ge=0)], Literal["auto"]] = Field("auto", description="Perturbation scale, or 'auto' (≤1% NLL "
                                                                     "change).")
    nll_threshold: float = Field(0.01, gt=0)
    search_iterations: int = Field(10, ge=1)
    sigma_max: float = Field(1.0, gt=0)
    anchor_size: int = Field(8, ge=1)
    anchor_data: Optional[str] = None  # GSM8K-format JSONL for the σ search; default: the first `anchor_size`
    # records of `data`, which are then left out of the evaluation (no evaluated gold answer picks σ)
    anchor_answer: Literal["solution", "final"] = "solution"  # σ-search answer after the prompt: " " + the whole
    # answer field (GSM8K reasoning) or just the final answer (models trained to answer directly); its NLL only
    score: Literal["total", "aleatoric", "epistemic"] = Field("epistemic", description="The uncertainty that "
                                                              "selects (best-of-N) and is scored (AUROC).")
    aggregate: Literal["mean", "sum", "max"] = "mean"

    @field_validator("sigma")
    @classmethod
    def _finite_non_negative(cls, value):
        if value != "auto" and not (math.isfinite(value) and value >= 0):
            raise ValueError("sigma must be 'auto' or a finite number >= 0")
        return value
