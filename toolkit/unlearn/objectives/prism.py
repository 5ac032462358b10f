"""PRISM: FGSM-robust probe, then NPO + annealed probe term + SAM + retain-orthogonal forget gradient
(https://arxiv.org/abs/2509.23362; the math is toolkit/unlearn/prism.py)."""

from toolkit.core.registry import register
from toolkit.unlearn.config import TRAIN_FLAGS, PrismConfig


def plan(config: PrismConfig, ctx) -> dict:
    return {"stages": ["probe (FGSM-robust, mean-pooled h_l)", "NPO + annealed probe term, SAM, projection"],
            "probe_layer": config.probe_layer or "3/4 depth", "epochs": config.epochs, "max_steps": config.max_steps}


@register("unlearn", "prism", config=PrismConfig, needs_retain=True, plan=plan,
          paper="https://arxiv.org/abs/2509.23362", flags=[*TRAIN_FLAGS, "probe_layer", "sam_rho", "adv_gamma"],
          help="PRISM: robust probe, then NPO + annealed probe term + SAM + retain-orthogonal forget gradient.",
          epilog="Examples: iclrkit unlearn prism -m ./memorised -f forget.json -r retain.json -o runs/prism | "
                 "iclrkit unlearn prism -m zoo:smollm2-135m -f forget.txt -r retain.txt --set sam_rho=0 -o out")
def prism(config: PrismConfig, ctx, model, corpus):
    from toolkit.unlearn.prism import setup

    return setup(config, ctx, model, corpus)
