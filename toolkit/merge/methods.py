"""The merge methods on the core registry (kind "merge"): each is one registration, picked by its name everywhere
(the CLI's commands, the streamed and in-memory weight-space merges, the mergekit translation).

A tensor-by-tensor method (`tensorwise=True`) registers the function merging one tensor of every model:

    @register("merge", "average", config=AverageConfig, tensorwise=True, needs_base=False, rowwise=True, ...)
    def average(tensors, base, options, dtype=None): ...

`toolkit.merge.common.merge_states` / `stream_merge` apply it to every tensor (`rowwise`: it is elementwise, so a
streamed merge may feed it row chunks of a large tensor; `prepare(options, n)` checks and completes the options
once per merge), and `toolkit.merge.weightspace.run_weightspace` runs it as a command. A whole-model method
(`tensorwise=False`: padded, latent) registers its run(config, ctx). Metadata the CLI reads: `help`, `epilog`,
`flags` (config fields that become options), `inputs` (fields naming input paths besides the models), `group`
(a sub-command group) and `command` (its name there); `mergekit` names the mergekit `merge_method` it computes.

This module is light to import (the CLI lists it to build --help): the math is imported when a merge runs.
"""

from __future__ import annotations

from dataclasses import replace

from toolkit.core.registry import register
from toolkit.merge.config import (
    AverageConfig,
    LatentMergeConfig,
    MergeOptions,
    PaddedConfig,
    TaskArithmeticConfig,
    TiesConfig,
)

TA_PAPER = "https://arxiv.org/abs/2212.04089"
TIES_PAPER = "https://arxiv.org/abs/2306.01708"


def _normalised(options: MergeOptions, n: int) -> MergeOptions:
    from toolkit.merge.baselines import normalise_weights

    return replace(options, weights=normalise_weights(options.weights, n))


def _weights_count(options: MergeOptions, n: int) -> MergeOptions:
    from toolkit.core.errors import require

    if options.weights is not None:
        require(len(options.weights) == n, f"{len(options.weights)} merge weights for {n} models")
    return options


def _ties_densities(options: MergeOptions, n: int) -> MergeOptions:
    from toolkit.merge.baselines import ties_densities

    return replace(options, densities=ties_densities(n, options.density, options.densities, options.weights))


@register("merge", "average", config=AverageConfig, tensorwise=True, needs_base=False, rowwise=True,
          prepare=_normalised, mergekit="linear", paper="", record=("weights",), flags=["models", "weights"],
          help="Weight averaging of same-size models.",
          epilog="Examples: iclrkit merge average -m a,b -o merged | "
                 "iclrkit merge average -m a -m b --weights 0.7,0.3 -o m")
def average(tensors, base, options: MergeOptions, dtype=None):
    """Σ wᵢ θᵢ with the normalised weights (a non-float tensor is the first model's)."""
    from toolkit.merge.baselines import average_tensor

    return average_tensor(tensors, options.weights, dtype)


@register("merge", "task-arithmetic", config=TaskArithmeticConfig, tensorwise=True, needs_base=True, rowwise=True,
          prepare=_weights_count, mergekit="task_arithmetic", paper=TA_PAPER, record=("scaling",),
          flags=["models", "base", "scaling"], inputs=("base",),
          help="Task arithmetic: base + λ · sum of task vectors.",
          epilog="Examples: iclrkit merge task-arithmetic -m a,b --base backbone --scaling 0.5 -o merged")
def task_arithmetic(tensors, base, options: MergeOptions, dtype=None):
    """θ_base + λ Σ wᵢ τᵢ (wᵢ = 1 without per-model weights)."""
    from toolkit.merge.baselines import task_arithmetic_tensor

    return task_arithmetic_tensor(tensors, base, options.scaling, options.weights, dtype=dtype)


@register("merge", "ties", config=TiesConfig, tensorwise=True, needs_base=True, rowwise=False,
          prepare=_ties_densities, mergekit="ties", paper=TIES_PAPER, record=("density", "scaling"),
          flags=["models", "base", "scaling", "density"], inputs=("base",),
          help="TIES-Merging: trim, elect sign, disjoint mean of task vectors.",
          epilog="Examples: iclrkit merge ties -m a,b --base backbone --density 0.2 -o merged")
def ties(tensors, base, options: MergeOptions, dtype=None):
    """Trim each τᵢ to its top-k, elect a sign per entry, average the agreeing entries (TIES; its top-k is over the
    whole tensor, so a streamed merge gives it whole tensors)."""
    from toolkit.merge.baselines import ties_tensor

    return ties_tensor(tensors, base, options.densities, options.scaling, options.weights, options.normalize,
                       dtype=dtype)


@register("merge", "padded", config=PaddedConfig, tensorwise=False,
          flags=["models", "target", "weights", "align"], inputs=("target",),
          help="Different widths/depths: shallower models deepened with identity layers, then zero-pad/truncate to "
               "the target's shapes and average (--align matches units first).",
          epilog="Examples: iclrkit merge padded -m small,big --target big -o merged | "
                 "iclrkit merge padded -m small,big --target big --align -o merged")
def padded(config: PaddedConfig, ctx) -> None:
    from toolkit.merge.weightspace import run_padded

    run_padded(config, ctx)


@register("merge", "latent", config=LatentMergeConfig, tensorwise=False, group="latent",
          command="run", flags=["models", "vae", "weights", "target", "interpolation", "code", "residual"],
          inputs=("vae", "target"),
          help="Merge models by interpolating their VAE codes and decoding.",
          epilog="Examples: iclrkit merge latent run --vae runs/vae -m a,b -o merged | "
                 "iclrkit merge latent run --vae runs/vae -m small,big --target big --weights 0.3,0.7 "
                 "--interpolation slerp -o merged | iclrkit merge latent run --vae runs/vae -m a,b "
                 "--no-residual -o pure")
def latent(config: LatentMergeConfig, ctx) -> None:
    from toolkit.merge.latent import run_merge

    run_merge(config, ctx)
