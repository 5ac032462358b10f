"""Baselines OBR is compared against, on the same pipeline and quantizers (see recipe.py):

- RTN: round-to-nearest per channel (optionally after a magnitude or Wanda mask).
- GPTQ (Frantar et al., ICLR 2023, https://arxiv.org/abs/2210.17323; IST-DASLab/gptq).
- SparseGPT with joint GPTQ quantization (Frantar & Alistarh, ICML 2023, https://arxiv.org/abs/2301.00774;
  IST-DASLab/sparsegpt).
- Wanda + RTN (Sun et al., ICLR 2024, https://arxiv.org/abs/2306.11695; locuslab/wanda).
- SparseGPT → GPTQ two-stage (llm-compressor's SparseGPTModifier then GPTQModifier): prune with SparseGPT, refit the
  quantizer on the sparse weights, GPTQ keeping the mask; one calibration pass, the same H for both stages.
The math lives in solvers.py, masks.py and quant.py.

Activation ordering (`actorder`, GPTQ and the two-stage baseline only; OBR's official code defines none):
- none: columns in their natural order (the original GPTQ);
- static / weight (llm-compressor: "static" is an alias of "weight"): columns processed in decreasing diag(H),
  scales fitted on the un-permuted weights, groups of consecutive original columns; the stored format is unchanged;
- group (llm-compressor's deprecated "group"/"dynamic"): groups are runs of the activation-ordered columns, scales
  fitted on the permuted weights; the packed file stores each column's group (`g_idx`). Needs `group_size`;
- auto (the default): static on unrotated models, none on rotated ones (recipe.resolve_defaults), as measured on
  SmolLM2 W4A16 (examples/obr/RESULTS.md: ordering 70.48 → 55.75 ppl unrotated, 41.66 → 43.16 rotated).
"""

from toolkit.compress.config import (  # noqa: F401 - the baselines' configs, declared in config.py
    ActOrder,
    GptqConfig,
    RtnConfig,
    SparsegptConfig,
    SparsegptGptqConfig,
    WandaConfig,
)
