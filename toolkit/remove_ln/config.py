"""The configs of `iclrkit remove-ln run | analyze` (torch-free, so the CLI builds its options from them).

Paper: "Transformers Don't Need LayerNorm at Inference Time" (Baroni, Khara, Schaeffer, Subkhankulov, Heimersheim),
https://arxiv.org/abs/2507.02559 — official code https://github.com/submarat/removing-layer-norm (config `gpt2`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from toolkit.core.config import BaseConfig
from toolkit.core.fields import data_field, model_field, onload_field

SigmaMode = Literal["recompute_on_real", "recompute_on_fake", "initial"]


class RemoveLNConfig(BaseConfig):
    """LayerNorm removal by fine-tuning. Defaults follow the official `gpt2` config except the batch, which the
    paper sets to 480 × 1024 tokens per step (~0.5M) and which is sized here for the machine at hand."""

    model: str = model_field()
    data: str | None = data_field(description="Training text: .txt, .jsonl[:field], 'embedded', or a hub dataset "
                                              "id.")
    eval_data: str | None = Field(None, description="Text for CE (default: 5% held out of --data, by paragraph).")
    steps: int = Field(300, ge=1, description="Optimizer steps (paper: 300 for GPT-2 small).")
    batch_size: int = Field(8, ge=1, description="Sequences per micro-batch.")
    grad_accum: int = Field(1, ge=1, description="Micro-batches per optimizer step.")
    seqlen: int | None = Field(None, gt=1, description="Tokens per sequence (default min(1024, n_positions)).")
    lr: float = Field(6e-4, gt=0, description="Peak learning rate of cosine_with_min_lr (paper 6e-4).")
    min_lr: float = 3e-4  # final LR (official 3e-4)
    warmup_fraction: float = 20 / 300  # warmup steps / steps (official 20 of 300)
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    momentum: float = 0.9  # EMA momentum of σ_avg (official 0.9)
    sigma_mode: SigmaMode = Field("recompute_on_real", description="How σ_avg is tracked: recompute_on_real (the "
                                                                     "paper's wording: tracked while real, frozen at "
                                                                     "the switch), recompute_on_fake or initial.")
    start_fraction: float = 20 / 300  # first removal at this fraction of the steps (official step 20 of 300)
    end_fraction: float = 116 / 300  # BOS stage (the last event) at this fraction (official step 116 of 300)
    gaps: tuple[int, int, int] = (2, 2, 3)  # relative gaps between ln_2 / ln_1-QK / ln_1-V removals
    eot_split: Literal["none", "line", "paragraph"] = "line"  # append EOT after each line/paragraph of `data`
    vanilla_control: bool = Field(False, description="Also fine-tune with LayerNorm on the same tokens (the "
                                                     "paper's baseline).")
    export: Literal["plain", "folded", "both"] = Field("plain", description="LN-free export: plain, folded or "
                                                                            "both.")
    eval_windows: int | None = 200  # CE on at most this many seqlen windows (None: all)
    calibration_batches: int = 4  # batches for the initial σ (the official std dicts)
    checkpoint_every: int = 50  # steps between --resume checkpoints
    log_every: int = 25



class AnalyzeConfig(BaseConfig):
    """DLA and CE of a GPT-2 (an LN-free export, plain or folded, or any original GPT-2 for comparison).

    Paper: https://arxiv.org/abs/2507.02559 — official code https://github.com/submarat/removing-layer-norm."""

    model: str = model_field()
    reference: str | None = Field(None, description="Compare with this model (e.g. the original): its CE and DLA "
                                                     "error are reported beside.")
    data: str | None = data_field(description="Text for CE and DLA.")
    seqlen: int | None = Field(None, gt=1, description="Tokens per window (default min(128, n_positions)).")
    windows: int = Field(16, ge=1, description="Windows for DLA.")
    eval_windows: int | None = 200  # CE on at most this many windows
    top: int = 10  # components listed by mean |DLA| on the correct next token
    onload: bool = onload_field()  # DLA and CE block by block (remove_ln/analyze.py analyze_onloaded)
