"""Instance-Level Contrast Shift: v = h(x⁺) − h(x⁻) from the single contrast pair `pair_index`."""

from toolkit.core.registry import register


@register("steer", "ilcs", paired=True,
          help="Instance-Level Contrast Shift: the difference of one contrast pair.")
def ilcs(undesired, neutral, pair_index: int = 0):
    from toolkit.steer.estimators import ilcs_direction

    return ilcs_direction(undesired, neutral, pair_index)
