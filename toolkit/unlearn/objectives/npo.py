"""NPO on the forget set plus the retain NLL, as MUSE's `npo_gdr` (https://arxiv.org/abs/2404.05868)."""

from toolkit.core.registry import register
from toolkit.unlearn.config import TRAIN_FLAGS, NpoConfig


@register("unlearn", "npo", config=NpoConfig, needs_retain=True, flags=TRAIN_FLAGS,
          help="NPO on the forget set plus the retain NLL (MUSE npo_gdr).",
          epilog="Examples: iclrkit unlearn npo -m ./memorised -f forget.json -r retain.json -o runs/npo")
def npo(config: NpoConfig, ctx, model, corpus):
    from toolkit.unlearn.baselines import setup_npo

    return setup_npo(config, ctx, model, corpus)
