"""DELLA (Deep et al., 2024, https://arxiv.org/abs/2406.11617): MagPrune drops task-vector entries with
probabilities that fall with their magnitude rank in the row (density ± epsilon), rescales the survivors, then
elects signs as TIES (della) or sums (della-linear). Drops are seeded per (seed, tensor, model)."""

from toolkit.core.registry import register
from toolkit.merge.config import TENSOR_FLAGS, DellaConfig, DellaLinearConfig
from toolkit.merge.methods.ties import SPARSIFIED_PARAMS, check_densities, densities_at


def _check(config: DellaConfig, n: int) -> None:
    from toolkit.core.errors import require

    check_densities(config, n)
    epsilons = config.epsilon if isinstance(config.epsilon, list) else [config.epsilon]
    densities = config.densities if config.densities is not None else [config.density]
    for d in (v for x in densities for v in (x if isinstance(x, list) else [x])):
        for e in epsilons:
            require(d >= 1 or (0 < d - e and d + e < 1), f"DELLA needs density ± epsilon in (0, 1), got {d} ± {e}")


def della(tensors, base, config: DellaConfig, site):
    from toolkit.merge import kernels

    n, mergekit = len(tensors), config.numerics == "mergekit"
    epsilon = site.at(config.epsilon)
    taus = [kernels.della_magprune(t - base, d, epsilon, site.generator(i), config.rescale, mergekit)
            for i, (t, d) in enumerate(zip(tensors, densities_at(config, site, n)))]
    weights = [site.at(w) for w in config.weights] if config.weights is not None else [1.0] * n
    return kernels.task_vector_merge(base, taus, weights, consensus=config.method == "della",
                                     normalize=config.normalize, scaling=site.at(config.scaling))


for _name, _mergekit, _config in (("della", "della", DellaConfig), ("della-linear", "della_linear", DellaLinearConfig)):
    _normalize = _config.model_fields["normalize"].default
    register("merge", _name, config=_config, tensorwise=True, needs_base=True, rowwise=False, min_models=1,
             check=_check, mergekit=_mergekit,
             mergekit_params={**SPARSIFIED_PARAMS, "epsilon": ("epsilon", "same")},
             paper="https://arxiv.org/abs/2406.11617", record=("density", "epsilon", "scaling"),
             flags=["models", "base", "scaling", "density", "epsilon", *TENSOR_FLAGS], inputs=("base",),
             help="DELLA: magnitude-ranked random drops (MagPrune), rescale, "
                  + ("TIES sign election." if _normalize else "summed."),
             epilog=f"Examples: iclrkit merge {_name} -m a,b --base backbone --density 0.5 --epsilon 0.1 -o m")(della)
