"""Weight averaging (model soup; mergekit's `linear`): Σ wᵢθᵢ / Σ wᵢ, or Σ wᵢθᵢ as given with normalize: false."""

from toolkit.core.registry import register
from toolkit.merge.config import TENSOR_FLAGS, AverageConfig


def _check(config: AverageConfig, n: int) -> None:
    from toolkit.merge.common import nonnegative_weights

    if config.normalize:
        nonnegative_weights(config.weights)


@register("merge", "average", config=AverageConfig, tensorwise=True, needs_base=False, rowwise=True, check=_check,
          mergekit="linear", mergekit_params={"weight": ("weights", "model"), "normalize": ("normalize", "global")},
          paper="https://arxiv.org/abs/2203.05482", record=("weights",), flags=["models", "weights", *TENSOR_FLAGS],
          help="Weight averaging of same-size models.",
          epilog="Examples: iclrkit merge average -m a,b -o merged | "
                 "iclrkit merge average -m a -m b --weights 0.7,0.3 -o m")
def average(tensors, base, config: AverageConfig, site):
    """Σ wᵢ θᵢ with the weights normalised (uniform by default), in float64; with numerics=mergekit accumulated in
    float32 and divided by Σ wᵢ as mergekit's linear does."""
    import torch

    from toolkit.merge import kernels
    from toolkit.merge.baselines import average_tensor, normalise_weights

    n = len(tensors)
    weights = [site.at(w) for w in config.weights] if config.weights is not None else None
    if config.numerics == "mergekit":
        dtype = torch.float64 if tensors[0].dtype == torch.float64 else torch.float32
        return kernels.linear(tensors, weights or [1.0] * n, config.normalize, dtype).to(tensors[0].dtype)
    if config.normalize:
        return average_tensor(tensors, normalise_weights(weights, n))
    return average_tensor(tensors, weights if weights is not None else [1.0] * n)
