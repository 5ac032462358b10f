"""Unpaired Mean Shift: v = mean(h over D⁺) − mean(h over D⁻); the sets may differ in size and topic."""

from toolkit.core.registry import register


@register("steer", "ums", paired=False,
          help="Unpaired Mean Shift: difference of the undesired and neutral means.")
def ums(undesired, neutral, pair_index: int = 0):
    from toolkit.steer.estimators import ums_direction

    return ums_direction(undesired, neutral)
