"""EAMET (Dai, Ji, Li, Wang; arXiv 2505.11876): MEMIT whose values are aligned with the key similarity structure.

Paper: https://arxiv.org/abs/2505.11876 · official code: https://github.com/ybdai7/EAMET-massive-editing
The alignment itself (its math, tested against the official keep_cs_structure) is toolkit/edit/eamet.py; with both
alignment weights 0 the method is MEMIT with EAMET's defaults."""

from toolkit.core.registry import register
from toolkit.edit.config import BASE_FLAGS, EametConfig


@register("edit", "eamet", config=EametConfig, paper="https://arxiv.org/abs/2505.11876",
          flags=[*BASE_FLAGS, "tau", "top_m", "cs_factor", "mse_factor"],
          help="EAMET: MEMIT whose values are aligned with the key similarity structure.",
          epilog="Examples: iclrkit edit eamet -m zoo:smollm2-135m -d zsre_mend_train-1k.json -n 1000 -o runs/eamet | "
                 "iclrkit edit eamet -m ./llama -d counterfact.json --set cs_factor=0 --set mse_factor=0 -o out")
def eamet(config: EametConfig):
    """The embedding alignment, optimised request by request; none when both of its weights are 0."""
    if config.cs_factor == 0 and config.mse_factor == 0:
        return None
    from toolkit.edit.eamet import EmbeddingAlignment

    return EmbeddingAlignment(config)
