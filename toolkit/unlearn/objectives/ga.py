"""Gradient ascent on the forget NLL; with retain_coeff > 0 also descent on the retain NLL (GA+GDR)."""

from toolkit.core.registry import register
from toolkit.unlearn.config import TRAIN_FLAGS, GaConfig


@register("unlearn", "ga", config=GaConfig, needs_retain=lambda config: config.retain_coeff > 0, flags=TRAIN_FLAGS,
          help="Gradient ascent on the forget NLL (add --set retain_coeff=1 for GA+GDR).",
          epilog="Examples: iclrkit unlearn ga -m ./memorised -f forget.json -o runs/ga")
def ga(config: GaConfig, ctx, model, corpus):
    from toolkit.unlearn.baselines import setup_ga

    return setup_ga(config, ctx, model, corpus)
