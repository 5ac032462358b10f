"""Magnitude pruning: zero the smallest |W| of each output row (unstructured) or of each group of M (N:M), weights
kept as they are; with --w-bits < 16 the kept weights are rounded to the grid afterwards (RTN). No calibration
statistics are used, so it is the floor every data-aware pruner (Wanda, SparseGPT, OBR) should beat. As a recipe
stage, a pruner: the mask alone, handed to the next stage ([magnitude, rtn] is this method with --w-bits < 16).

The whole method is this file: its config, its function, its registration."""

from typing import Literal

from pydantic import Field

from toolkit.compress.config import BASE_FLAGS, CompressConfig
from toolkit.compress.stages import MASK_KNOBS
from toolkit.core.registry import register


class MagnitudeConfig(CompressConfig):
    """`iclrkit compress magnitude`: |W| pruning (50% by default), float weights unless --w-bits < 16."""

    method: Literal["magnitude"] = "magnitude"
    sparsity: float = Field(0.5, description="Unstructured sparsity per output row, [0, 1).")
    w_bits: int = Field(16, description="Weight bits after pruning (2-8; 16 = keep the kept weights as they are).")


def magnitude_mask(job):
    from toolkit.compress.masks import magnitude_scores, make_mask, parse_nm

    return make_mask(magnitude_scores(job.W), job.config.sparsity, parse_nm(job.config.nm))


@register("compress", "magnitude", config=MagnitudeConfig, needs_hessian=False, flags=BASE_FLAGS,
          help="Magnitude pruning (smallest |W| per row, or N:M); --w-bits < 16 rounds the kept weights (RTN).")
def magnitude(job):
    return job.rounded(magnitude_mask(job))


@register("compress-stage", "magnitude", config=MagnitudeConfig, role="prune", needs_hessian=False,
          knobs=MASK_KNOBS)
def magnitude_stage(job):
    return job.W, magnitude_mask(job), None
