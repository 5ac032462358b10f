"""Different sizes: shallower models deepened, zero-pad/truncate to the target's shapes, then average."""

from toolkit.core.registry import register
from toolkit.merge.config import PaddedConfig


@register("merge", "padded", config=PaddedConfig, tensorwise=False,
          flags=["models", "target", "weights", "align"], inputs=("target",),
          help="Different widths/depths: shallower models deepened with identity layers, then zero-pad/truncate to "
               "the target's shapes and average (--align matches units first).",
          epilog="Examples: iclrkit merge padded -m small,big --target big -o merged | "
                 "iclrkit merge padded -m small,big --target big --align -o merged")
def padded(config: PaddedConfig, ctx) -> None:
    from toolkit.merge.weightspace import run_padded

    run_padded(config, ctx)
