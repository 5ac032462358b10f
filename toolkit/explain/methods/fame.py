"""FAME: formal abstract minimal explanations (arXiv 2603.10661), the math in toolkit/explain/fame.py."""

from toolkit.core.registry import register
from toolkit.explain.config import FameConfig


@register("explain", "fame", config=FameConfig, flags=["knapsack", "refine"],
          help="Formal abstract minimal explanations (FAME, arXiv 2603.10661) with CROWN bounds.",
          epilog="Examples: iclrkit explain fame -m zoo:digits-mlp --out runs/fame | "
                 "iclrkit explain fame -m net.onnx -d images.npz --epsilon 0.02 --verify exact --out runs/f")
def fame(config: FameConfig, ctx) -> dict:
    from toolkit.explain.fame import run

    return run(config, ctx)
