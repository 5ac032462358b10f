"""SmoothQuant-style smoothing as a whole-model recipe stage ([smooth, gptq], [smooth, rotate, gptq]); the math and
its refusals are toolkit/compress/smooth.py."""

from pydantic import Field

from toolkit.core.config import BaseConfig
from toolkit.core.registry import register


class SmoothConfig(BaseConfig):
    """The `smooth` stage's knob (SmoothQuant, https://arxiv.org/abs/2211.10438; mit-han-lab/smoothquant)."""

    alpha: float = Field(0.5, ge=0, le=1, description="Migration strength α in s = max|X|^α / max|W|^(1−α) (0.5: "
                                                      "the paper's default; larger moves more of the activations' "
                                                      "range into the weights).")


@register("compress-stage", "smooth", config=SmoothConfig, role="transform", knobs=["alpha"],
          help="SmoothQuant: per-channel scales migrated from the activations into the linears a norm feeds, "
               "folded into that norm.")
def smooth(view, windows, stage_config, run_config, ctx) -> dict:
    from toolkit.compress.smooth import smooth_model

    scales = smooth_model(view, windows, stage_config.alpha, ctx.device)
    every = [float(v) for s in scales.values() for v in (s.min(), s.max())]
    ctx.metrics["smooth"] = {"norms": len(scales), "alpha": stage_config.alpha,
                             "scale_range": [round(min(every), 6), round(max(every), 6)]}
    return {}
