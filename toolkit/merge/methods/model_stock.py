"""Model Stock (Jang et al., ECCV 2024, https://arxiv.org/abs/2403.19522): the fine-tuned models' average, pulled
towards the base by t = k·cosθ / (1 + (k − 1)·cosθ) (the math: toolkit/merge/kernels.py model_stock)."""

from toolkit.core.registry import register
from toolkit.merge.config import TENSOR_FLAGS, ModelStockConfig


@register("merge", "model-stock", config=ModelStockConfig, tensorwise=True, needs_base=True, rowwise=False,
          mergekit="model_stock", mergekit_params={"filter_wise": ("filter_wise", "global")},
          paper="https://arxiv.org/abs/2403.19522", record=("filter_wise",),
          flags=["models", "base", "filter_wise", *TENSOR_FLAGS], inputs=("base",),
          help="Model Stock: average of fine-tuned models moved towards the base by their task vectors' angle.",
          epilog="Examples: iclrkit merge model-stock -m ft1,ft2,ft3 --base backbone -o merged")
def model_stock(tensors, base, config: ModelStockConfig, site):
    from toolkit.merge import kernels

    return kernels.model_stock(base, tensors, config.filter_wise)
