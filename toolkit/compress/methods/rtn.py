"""Round-to-nearest weights (per channel or grouped, symmetric, MSE clip), after an optional mask; Wanda + RTN
(Sun et al., ICLR 2024, https://arxiv.org/abs/2306.11695; locuslab/wanda)."""

from toolkit.compress.config import BASE_FLAGS, RtnConfig, WandaConfig
from toolkit.core.registry import register


def masked_rtn(job):
    return job.rounded(job.mask)


register("compress", "rtn", config=RtnConfig, needs_hessian=False, flags=BASE_FLAGS,
         help="Round-to-nearest weights (per channel, symmetric, MSE clip); --sparsity adds a magnitude mask.")(
    masked_rtn)
register("compress", "wanda", config=WandaConfig, needs_hessian=False, flags=BASE_FLAGS,
         help="Wanda pruning (|W|·‖x‖) followed by RTN (50% by default).")(masked_rtn)
