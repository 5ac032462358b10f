"""Task arithmetic (Ilharco et al., ICLR 2023): θ_base + λ Σ wᵢ τᵢ, τᵢ = θᵢ − θ_base (÷ Σ wᵢ with normalize)."""

from toolkit.core.registry import register
from toolkit.merge.config import TENSOR_FLAGS, TaskArithmeticConfig


def fold(values: dict, weights: list) -> dict:
    """mergekit → iclrkit: uniform weights fold into λ (so the merge is the plain `iclrkit merge task-arithmetic`),
    other weights are divided by their sum when normalize."""
    lam, normalize = values.get("scaling", 1.0), values.pop("normalize", False)
    if any(isinstance(w, list) for w in weights) or isinstance(lam, list):
        return {**values, "weights": weights, "normalize": normalize}
    divisor = sum(weights) if normalize and abs(sum(weights)) >= 1e-8 else 1.0
    if len(set(weights)) == 1:
        return {**values, "scaling": lam * weights[0] / divisor}
    return {**values, "weights": [w / divisor for w in weights], "scaling": lam}


@register("merge", "task-arithmetic", config=TaskArithmeticConfig, tensorwise=True, needs_base=True, rowwise=True,
          min_models=1, mergekit="task_arithmetic", mergekit_fold=fold,
          mergekit_params={"weight": ("weights", "model"), "lambda": ("scaling", "global"),
                           "normalize": ("normalize", "global")},
          paper="https://arxiv.org/abs/2212.04089", record=("scaling",),
          flags=["models", "base", "scaling", *TENSOR_FLAGS], inputs=("base",),
          help="Task arithmetic: base + λ · sum of task vectors.",
          epilog="Examples: iclrkit merge task-arithmetic -m a,b --base backbone --scaling 0.5 -o merged")
def task_arithmetic(tensors, base, config: TaskArithmeticConfig, site):
    """θ_base + λ Σ wᵢ τᵢ (wᵢ = 1 without per-model weights) in float64, or mergekit's operations."""
    from toolkit.merge import kernels
    from toolkit.merge.baselines import task_arithmetic_tensor

    weights = [site.at(w) for w in config.weights] if config.weights is not None else None
    scaling = site.at(config.scaling)
    if config.numerics == "mergekit" or config.normalize:
        return kernels.task_vector_merge(base, [t - base for t in tensors], weights or [1.0] * len(tensors),
                                         consensus=False, normalize=config.normalize, scaling=scaling)
    return task_arithmetic_tensor(tensors, base, scaling, weights)
