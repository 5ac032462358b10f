"""DARE (Yu et al., ICML 2024, https://arxiv.org/abs/2311.03099): drop each task-vector entry with probability
1 − density and rescale the survivors (to τ's L1 norm, as mergekit does), then sum the weighted τ (dare-linear) or
elect signs as TIES (dare-ties). Drops are seeded per (seed, tensor, model): the same in memory and streamed."""

from toolkit.core.registry import register
from toolkit.merge.config import TENSOR_FLAGS, DareConfig
from toolkit.merge.methods.ties import SPARSIFIED_PARAMS, check_densities, densities_at

PAPER = "https://arxiv.org/abs/2311.03099"
FLAGS = ["models", "base", "scaling", "density", *TENSOR_FLAGS]


def dare(tensors, base, config: DareConfig, site):
    from toolkit.merge import kernels

    n, mergekit = len(tensors), config.numerics == "mergekit"
    taus = [kernels.random_drop(t - base, d, site.generator(i), config.rescale, mergekit)
            for i, (t, d) in enumerate(zip(tensors, densities_at(config, site, n)))]
    weights = [site.at(w) for w in config.weights] if config.weights is not None else [1.0] * n
    return kernels.task_vector_merge(base, taus, weights, consensus=config.method == "dare-ties",
                                     normalize=config.normalize, scaling=site.at(config.scaling))


for _name, _mergekit, _how in (("dare-ties", "dare_ties", "then TIES' sign election"),
                               ("dare-linear", "dare_linear", "then summed")):
    register("merge", _name, config=DareConfig, tensorwise=True, needs_base=True, rowwise=False, min_models=1,
             check=check_densities, mergekit=_mergekit, mergekit_params=SPARSIFIED_PARAMS, paper=PAPER,
             record=("density", "scaling"), flags=FLAGS, inputs=("base",),
             help=f"DARE: drop task-vector entries at random (keep --density), rescale, {_how}.",
             epilog=f"Examples: iclrkit merge {_name} -m a,b --base backbone --density 0.5 --seed 1 -o merged")(dare)
