"""Baselines OBR is compared against, on the same pipeline and quantizers (see recipe.py):

- RTN: round-to-nearest per channel (optionally after a magnitude or Wanda mask).
- GPTQ (Frantar et al., ICLR 2023, https://arxiv.org/abs/2210.17323; IST-DASLab/gptq).
- SparseGPT with joint GPTQ quantization (Frantar & Alistarh, ICML 2023, https://arxiv.org/abs/2301.00774;
  IST-DASLab/sparsegpt).
- Wanda + RTN (Sun et al., ICLR 2024, https://arxiv.org/abs/2306.11695; locuslab/wanda).
The math lives in solvers.py, masks.py and quant.py.
"""

from __future__ import annotations

from typing import Literal

from toolkit.compress.recipe import CompressConfig


class RtnConfig(CompressConfig):
    """`iclrkit compress rtn`: per-channel symmetric round-to-nearest; with --sparsity, magnitude mask first."""

    method: Literal["rtn"] = "rtn"
    mask: Literal["magnitude", "wanda"] = "magnitude"


class GptqConfig(CompressConfig):
    """`iclrkit compress gptq`: GPTQ (blocksize 128, 1% damping); with --sparsity, a fixed mask first."""

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
