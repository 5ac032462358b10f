"""LS-Merge: merge models by interpolating their VAE codes (toolkit/merge/latent.py)."""

from toolkit.core.registry import register
from toolkit.merge.config import LatentMergeConfig


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
