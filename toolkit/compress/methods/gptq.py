"""GPTQ (Frantar et al., ICLR 2023, https://arxiv.org/abs/2210.17323; IST-DASLab/gptq) with activation ordering
(config._Ordered), after an optional fixed mask (its own --sparsity, or in a recipe the mask of the stage before)."""

from toolkit.compress.config import BASE_FLAGS, GptqConfig
from toolkit.compress.stages import QUANT_KNOBS
from toolkit.core.registry import register


@register("compress", "gptq", config=GptqConfig, needs_hessian=True, stack_rows=True,
          flags=[*BASE_FLAGS, "actorder"],
          help="GPTQ weight quantization on the same pipeline (activation ordering on); --sparsity adds a fixed "
               "mask.")
def gptq(job):
    from toolkit.compress.solvers import gptq as solve

    keep = job.mask
    return solve(job.W, job.hessian, job.scale, job.bits, mask=keep, blocksize=job.config.blocksize,
                 order=job.order), keep, job.grid


register("compress-stage", "gptq", config=GptqConfig, role="quantize", needs_hessian=True, stack_rows=True,
         knobs=[*QUANT_KNOBS, "actorder", "blocksize"])(gptq)
