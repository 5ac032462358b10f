"""Round-to-nearest weights (per channel or grouped, symmetric, MSE clip), after an optional mask; Wanda + RTN."""

from toolkit.compress.config import BASE_FLAGS, RtnConfig, WandaConfig
from toolkit.core.registry import register


def masked_rtn(job):
    from toolkit.compress.quant import quantize_rows

    keep, scale = job.mask, job.scale
    out = quantize_rows(job.W * keep, scale, job.bits) if scale is not None else job.W * keep
    return out, keep, job.grid


register("compress", "rtn", config=RtnConfig, needs_hessian=False, flags=BASE_FLAGS,
         help="Round-to-nearest weights (per channel, symmetric, MSE clip); --sparsity adds a magnitude mask.")(
    masked_rtn)
register("compress", "wanda", config=WandaConfig, needs_hessian=False, flags=BASE_FLAGS,
         help="Wanda pruning (|W|·‖x‖) followed by RTN (50% by default).")(masked_rtn)
