"""`iclrkit compress recipe`: the stages a YAML recipe lists (toolkit/compress/stages.py), run on the shared
pipeline: whole-model stages (smooth, rotate) before the block pass, then each linear through the per-linear stages
(pruner, quantizer) in one sequential pass per block."""

from typing import Any, Literal

from pydantic import Field, model_validator

from toolkit.compress.config import CompressConfig
from toolkit.compress.stages import needs_hessian, stacks_rows
from toolkit.core.registry import register


class RecipeConfig(CompressConfig):
    """`iclrkit compress recipe`: the stages come from `recipe` (a YAML file) or inline `stages` (in --config); the
    stages' knobs (w_bits, sparsity, actorder, rotation, ...) are set on the stages, the run's (model, data,
    calibration, a_bits/kv_bits, export, ...) here. After validation `stages` holds the resolved recipe."""

    method: Literal["recipe"] = "recipe"
    recipe: str | None = Field(None, description="Recipe YAML: the stages in order, each a registered stage with its "
                                                 "knobs, e.g. `stages: [sparsegpt, {gptq: {w_bits: 4}}]` "
                                                 "(examples/compress-recipes/).")
    # the stages as given inline (names or {name: {knob: value}}), then as resolved: [{name: {every knob}}]
    stages: list[Any] | None = None

    @model_validator(mode="after")
    def _resolve_stages(self):
        from toolkit.compress.stages import apply_recipe

        return apply_recipe(self)


RECIPE_FLAGS = ["recipe", "model", "data", "eval_data", "a_bits", "kv_bits", "kv_quant", "nsamples", "seqlen"]


@register("compress", "recipe", config=RecipeConfig, needs_hessian=needs_hessian, stack_rows=stacks_rows,
          flags=RECIPE_FLAGS,
          epilog="Examples: iclrkit compress recipe --recipe examples/compress-recipes/sparsegpt-gptq.yaml --model "
                 "zoo:llama-small --data valid.txt --eval-data test.txt --out runs/recipe | add --dry-run for the "
                 "resolved stages. Stages: rotate, smooth (whole model, first); magnitude, wanda, sparsegpt "
                 "(pruners); gptq, rtn, obr (quantizers).",
          help="Run a compression recipe: registered stages in order (e.g. [sparsegpt, gptq], [rotate, obr], "
               "[smooth, gptq]) in one sequential pass per block.")
def recipe(job):
    from toolkit.compress.stages import linear_stages, run_linear

    return run_linear(job, linear_stages(job.config))
