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
  fitted on the permuted weights; the packed file stores each column's group (`g_idx`). Needs `group_size`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import model_validator

from toolkit.compress.recipe import CompressConfig

ActOrder = Literal["none", "static", "weight", "group"]


class _Ordered(CompressConfig):
    actorder: ActOrder = "static"  # measured on SmolLM2 (examples/obr/RESULTS.md)

    @model_validator(mode="after")
    def _group_needs_groups(self):
        if self.actorder == "group" and self.group_size is None:
            raise ValueError("actorder=group needs grouped scales: set --group-size (e.g. 128)")
        return self


class RtnConfig(CompressConfig):
    """`iclrkit compress rtn`: per-channel symmetric round-to-nearest; with --sparsity, magnitude mask first."""

    method: Literal["rtn"] = "rtn"
    mask: Literal["magnitude", "wanda"] = "magnitude"


class GptqConfig(_Ordered):
    """`iclrkit compress gptq`: GPTQ (blocksize 128, 1% damping, activation ordering); with --sparsity, a fixed mask
    first."""

    method: Literal["gptq"] = "gptq"
    mask: Literal["magnitude", "wanda"] = "magnitude"


class SparsegptConfig(CompressConfig):
    """`iclrkit compress sparsegpt`: SparseGPT 50% with joint GPTQ quantization (the paper's baseline)."""

    method: Literal["sparsegpt"] = "sparsegpt"
    sparsity: float = 0.5


class WandaConfig(CompressConfig):
    """`iclrkit compress wanda`: Wanda mask (|W|·‖x‖) then RTN."""

    method: Literal["wanda"] = "wanda"
    sparsity: float = 0.5
    mask: Literal["wanda"] = "wanda"


class SparsegptGptqConfig(_Ordered):
    """`iclrkit compress sparsegpt-gptq`: the two-stage baseline, SparseGPT 50% → refit scales → GPTQ (mask kept)."""

    method: Literal["sparsegpt-gptq"] = "sparsegpt-gptq"
    sparsity: float = 0.5
