"""TIES-Merging (Yadav et al., NeurIPS 2023): trim each τᵢ to its top-k magnitudes, elect a sign per entry, average
the agreeing entries; θ = θ_base + λ τ."""

from toolkit.core.registry import register
from toolkit.merge.config import TENSOR_FLAGS, TiesConfig

# the mergekit parameters of every sparsified task-vector merge (TIES, DARE, DELLA, breadcrumbs)
SPARSIFIED_PARAMS = {"weight": ("weights", "model"), "density": ("densities", "model"), "lambda": ("scaling", "global"),
                     "normalize": ("normalize", "global"), "rescale": ("rescale", "global"), "int8_mask": (None, "global")}


def check_densities(config, n: int) -> None:
    """Every density (scalar, per model, or a gradient's values) in (0, 1]."""
    from toolkit.core.errors import require

    values = config.densities if config.densities is not None else [config.density]
    for value in (v for d in values for v in (d if isinstance(d, list) else [d])):
        require(0.0 < value <= 1.0, f"density must be in (0, 1], got {value}")


def densities_at(config, site, n: int) -> list[float]:
    return [site.at(d) for d in (config.densities if config.densities is not None else [config.density] * n)]


def fold(values: dict, weights: list) -> dict:
    """mergekit → iclrkit: with every weight and density the same, normalize on and w > 0, the plain `iclrkit merge
    ties` (its count-based mean is mergekit's weighted one); otherwise the per-model lists."""
    densities = values.pop("densities")
    uniform = len({repr(w) for w in weights}) == 1 and not isinstance(weights[0], list)
    if len({repr(d) for d in densities}) == 1:
        values["density"] = densities[0]
    else:
        values["densities"] = densities
    if not (uniform and values.get("normalize", True) and weights[0] > 0 and "densities" not in values):
        values["weights"] = weights
    return values


@register("merge", "ties", config=TiesConfig, tensorwise=True, needs_base=True, rowwise=False, min_models=1,
          check=check_densities, mergekit="ties", mergekit_params=SPARSIFIED_PARAMS, mergekit_fold=fold,
          paper="https://arxiv.org/abs/2306.01708", record=("density", "scaling"),
          flags=["models", "base", "scaling", "density", *TENSOR_FLAGS], inputs=("base",),
          help="TIES-Merging: trim, elect sign, disjoint mean of task vectors.",
          epilog="Examples: iclrkit merge ties -m a,b --base backbone --density 0.2 -o merged")
def ties(tensors, base, config: TiesConfig, site):
    """Trim each τᵢ to its top-k, elect a sign per entry, average the agreeing entries (TIES; its top-k is over the
    whole tensor, so a streamed merge gives it whole tensors)."""
    from toolkit.merge import kernels
    from toolkit.merge.baselines import ties_tensor

    n = len(tensors)
    densities = densities_at(config, site, n)
    weights = [site.at(w) for w in config.weights] if config.weights is not None else None
    scaling = site.at(config.scaling)
    if config.numerics == "mergekit" or config.rescale:
        taus = [kernels.magnitude(t - base, d, config.rescale) for t, d in zip(tensors, densities)]
        return kernels.task_vector_merge(base, taus, weights or [1.0] * n, consensus=True,
                                         normalize=config.normalize, scaling=scaling)
    return ties_tensor(tensors, base, densities, scaling, weights, config.normalize)
