"""OBR: Optimal Brain Restoration (joint quantization + sparsity; the math is toolkit/compress/obr.py). As a recipe
stage, a quantizer that prunes with its own mask knobs (the paper's joint form): [rotate, obr] is `compress obr`."""

from toolkit.compress.config import BASE_FLAGS, ObrConfig
from toolkit.compress.stages import MASK_KNOBS, QUANT_KNOBS
from toolkit.core.registry import register


@register("compress", "obr", config=ObrConfig, needs_hessian=True, flags=[*BASE_FLAGS, "alpha", "mode"],
          paper="https://arxiv.org/abs/2509.11177",
          help="OBR: Optimal Brain Restoration (W4A4KV4 + 50% sparsity by default).")
def obr(job):
    from toolkit.compress.obr import obr_quantize

    config, keep = job.config, job.mask
    out = obr_quantize(job.W, job.hessian, keep, job.scale, job.bits, config.alpha, config.mode, config.blocksize,
                       config.solver, tol=config.solver_tol if config.solver == "cg" else None)
    return out, keep, job.grid


register("compress-stage", "obr", config=ObrConfig, role="quantize", own_mask=True, needs_hessian=True,
         knobs=[*QUANT_KNOBS, *MASK_KNOBS, "mask", "alpha", "mode", "solver", "solver_tol", "blocksize"])(obr)
