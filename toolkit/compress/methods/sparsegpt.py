"""SparseGPT with joint GPTQ quantization (one pass, the paper's form; Frantar & Alistarh, ICML 2023,
https://arxiv.org/abs/2301.00774; IST-DASLab/sparsegpt), its pruning alone as the recipe stage `sparsegpt` (OBS
updates of the kept weights, no quantization), and the two-stage SparseGPT → GPTQ (llm-compressor's
SparseGPTModifier then GPTQModifier), which is the recipe [sparsegpt, gptq]: prune, refit the quantizer on the
sparse weights, GPTQ keeping the mask, one calibration pass, the same H for both stages."""

from toolkit.compress.config import BASE_FLAGS, SparsegptConfig, SparsegptGptqConfig
from toolkit.compress.stages import MASK_KNOBS
from toolkit.core.registry import register


@register("compress", "sparsegpt", config=SparsegptConfig, needs_hessian=True, flags=BASE_FLAGS,
          help="SparseGPT pruning with joint GPTQ quantization, one pass (50% by default).")
def sparsegpt(job):
    from toolkit.compress.masks import parse_nm
    from toolkit.compress.solvers import sparsegpt as solve

    config = job.config
    out, keep = solve(job.W, job.hessian, job.scale, job.bits, config.sparsity, parse_nm(config.nm),
                      config.blocksize)
    return out, keep, job.grid


@register("compress-stage", "sparsegpt", config=SparsegptConfig, role="prune", needs_hessian=True,
          knobs=[*MASK_KNOBS, "blocksize"])
def sparsegpt_prune(job):
    from toolkit.compress.masks import parse_nm
    from toolkit.compress.solvers import sparsegpt as solve

    config = job.config
    pruned, keep = solve(job.W, job.hessian, None, 16, config.sparsity, parse_nm(config.nm), config.blocksize)
    return pruned, keep, None


@register("compress", "sparsegpt-gptq", config=SparsegptGptqConfig, needs_hessian=True,
          flags=[*BASE_FLAGS, "actorder"],
          help="Two-stage baseline: SparseGPT pruning (50% by default), scales refit on the sparse weights, then "
               "GPTQ keeping the mask (llm-compressor's SparseGPT -> GPTQ). Runs the recipe [sparsegpt, gptq] "
               "(`compress recipe`) with these flags as its stages' knobs.")
def sparsegpt_gptq(job):
    from toolkit.compress.stages import run_linear, stage

    return run_linear(job, [stage("sparsegpt", job.config), stage("gptq", job.config)])
