"""SLERP: spherical interpolation between the base and one other model, tensor by tensor (mergekit's slerp)."""

from toolkit.core.registry import register
from toolkit.merge.config import TENSOR_FLAGS, SlerpConfig


def _check(config: SlerpConfig, n: int) -> None:
    from toolkit.core.errors import require

    require(n == 1, f"slerp interpolates the base and exactly one other model, got {n}")


@register("merge", "slerp", config=SlerpConfig, tensorwise=True, needs_base=True, rowwise=False, min_models=1,
          check=_check, mergekit="slerp", mergekit_params={"t": ("t", "global")},
          paper="https://en.wikipedia.org/wiki/Slerp", record=("t",), flags=["models", "base", "t", *TENSOR_FLAGS],
          inputs=("base",), help="SLERP: spherical interpolation from --base (t=0) to the other model (t=1).",
          epilog="Examples: iclrkit merge slerp --base a -m b --t 0.3 -o merged | "
                 "iclrkit merge slerp --base a -m b --t 0,0.5,1 -o gradient (t over the layers)")
def slerp(tensors, base, config: SlerpConfig, site):
    """Computed in float32 for float16/bfloat16/float32 tensors with numerics=mergekit (as mergekit), in float64
    otherwise; the result is stored in the tensors' (compute) dtype."""
    import torch

    from toolkit.merge import kernels

    dtype = torch.float64 if base.dtype == torch.float64 else torch.float32
    return kernels.slerp(site.at(config.t), base, tensors[0], dtype)
