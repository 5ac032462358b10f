"""Round-to-nearest weights (per channel or grouped, symmetric, MSE clip), after an optional mask; Wanda + RTN
(Sun et al., ICLR 2024, https://arxiv.org/abs/2306.11695; locuslab/wanda). As recipe stages: `rtn` (a quantizer)
and `wanda` (a pruner: the mask alone, |W|·‖x‖ per output row or N:M, handed to the next stage)."""

from toolkit.compress.config import BASE_FLAGS, RtnConfig, WandaConfig
from toolkit.compress.stages import MASK_KNOBS, QUANT_KNOBS
from toolkit.core.registry import register


def masked_rtn(job):
    return job.rounded(job.mask)


def mask_only(job):
    """A pruning stage that only chooses the kept entries (its config's scores at its sparsity / N:M)."""
    return job.W, job.mask, None


register("compress", "rtn", config=RtnConfig, needs_hessian=False, flags=BASE_FLAGS,
         help="Round-to-nearest weights (per channel, symmetric, MSE clip); --sparsity adds a magnitude mask.")(
    masked_rtn)
register("compress", "wanda", config=WandaConfig, needs_hessian=False, flags=BASE_FLAGS,
         help="Wanda pruning (|W|·‖x‖) followed by RTN (50% by default).")(masked_rtn)
register("compress-stage", "rtn", config=RtnConfig, role="quantize", needs_hessian=False, knobs=QUANT_KNOBS)(
    masked_rtn)
register("compress-stage", "wanda", config=WandaConfig, role="prune", needs_hessian=False, knobs=MASK_KNOBS)(
    mask_only)
