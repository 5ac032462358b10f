"""RMU (WMDP, https://arxiv.org/abs/2403.03218): push layer-ℓ forget activations to a random direction, keep the
retain activations; only the MLPs of blocks ℓ-2..ℓ train."""

from toolkit.core.registry import register
from toolkit.unlearn.config import TRAIN_FLAGS, RmuConfig


@register("unlearn", "rmu", config=RmuConfig, needs_retain=True, flags=[*TRAIN_FLAGS, "layer"],
          help="RMU: push layer-l forget activations to a random direction, keep retain activations.",
          epilog="Examples: iclrkit unlearn rmu -m ./memorised -f forget.json -r retain.json --layer 2 -o runs/rmu")
def rmu(config: RmuConfig, ctx, model, corpus):
    from toolkit.unlearn.baselines import setup_rmu

    return setup_rmu(config, ctx, model, corpus)
