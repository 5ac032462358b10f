"""Paired Contrast Mean Shift (the paper's method): v = (1/n) Σᵢ [h(xᵢ⁺) − h(xᵢ⁻)] over topic-matched pairs."""

from toolkit.core.registry import register


@register("steer", "pcms", paired=True,
          help="Paired Contrast Mean Shift: mean of topic-matched pair differences (the paper's method).")
def pcms(undesired, neutral, pair_index: int = 0):
    from toolkit.steer.estimators import pcms_direction

    return pcms_direction(undesired, neutral)
