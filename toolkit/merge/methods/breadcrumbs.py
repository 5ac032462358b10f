"""Model Breadcrumbs (Davari & Belilovsky, ECCV 2024, https://arxiv.org/abs/2312.06795): drop each task vector's
largest `gamma` share of magnitudes (outliers) and its smallest down to `density`, then sum (breadcrumbs) or elect
signs as TIES (breadcrumbs-ties)."""

from toolkit.core.registry import register
from toolkit.merge.config import TENSOR_FLAGS, BreadcrumbsConfig
from toolkit.merge.methods.ties import SPARSIFIED_PARAMS, check_densities, densities_at


def breadcrumbs(tensors, base, config: BreadcrumbsConfig, site):
    from toolkit.merge import kernels

    n, gamma = len(tensors), site.at(config.gamma)
    taus = [kernels.magnitude_outliers(t - base, d, gamma, config.rescale)
            for t, d in zip(tensors, densities_at(config, site, n))]
    weights = [site.at(w) for w in config.weights] if config.weights is not None else [1.0] * n
    return kernels.task_vector_merge(base, taus, weights, consensus=config.method == "breadcrumbs-ties",
                                     normalize=config.normalize, scaling=site.at(config.scaling))


for _name, _mergekit in (("breadcrumbs", "breadcrumbs"), ("breadcrumbs-ties", "breadcrumbs_ties")):
    register("merge", _name, config=BreadcrumbsConfig, tensorwise=True, needs_base=True, rowwise=False,
             min_models=1, check=check_densities, mergekit=_mergekit,
             mergekit_params={**SPARSIFIED_PARAMS, "gamma": ("gamma", "same")},
             paper="https://arxiv.org/abs/2312.06795", record=("density", "gamma", "scaling"),
             flags=["models", "base", "scaling", "density", "gamma", *TENSOR_FLAGS], inputs=("base",),
             help="Model Breadcrumbs: drop each task vector's outliers (--gamma) and smallest entries, then "
                  + ("TIES sign election." if _name.endswith("ties") else "sum."),
             epilog=f"Examples: iclrkit merge {_name} -m a,b --base backbone --density 0.9 --gamma 0.01 -o m"
             )(breadcrumbs)
