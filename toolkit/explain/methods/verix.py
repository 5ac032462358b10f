"""VeriX / VERIX+ sequential explanations, FAME's baseline (toolkit/explain/verix.py)."""

from toolkit.core.registry import register
from toolkit.explain.config import VerixConfig


@register("explain", "verix", config=VerixConfig, flags=["order", "oracle"],
          help="VeriX/VERIX+-style sequential explanations (baseline) with a CROWN or exact oracle.",
          epilog="Examples: iclrkit explain verix -m zoo:digits-mlp --out runs/verix | "
                 "iclrkit explain verix -m zoo:digits-mlp --oracle exact -n 10 --out runs/verix-exact")
def verix(config: VerixConfig, ctx) -> dict:
    from toolkit.explain.verix import run

    return run(config, ctx)
