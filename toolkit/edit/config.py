"""MEMIT's config (EAMET extends it): torch-free, so the CLI can build options from it."""

from __future__ import annotations

from typing import Literal

from pydantic import field_validator

from toolkit.core.config import BaseConfig


class MemitConfig(BaseConfig):
    """MEMIT with the hyperparameters of the official LLaMA configs (EAMET repo's MEMIT baseline).

    Paper https://arxiv.org/abs/2210.07229, code https://github.com/kmeng01/memit."""

    model: str
    data: str  # CounterFact / zsRE / EasyEdit .json or simple .jsonl facts
    n_edits: int | None = None  # first N records (None: all)
    layers: list[int] | None = None  # edit layers R; None: [3, 4] with >= 8 blocks, else the middle two
    mom2_update_weight: float = 15000.0  # λ in (λC + KKᵀ)
    cov_data: str = "embedded"  # text for C = E[kkᵀ]: .txt, .jsonl[:field], embedded, hub id
    cov_tokens: int = 100_000  # tokens streamed for C
    cov_seqlen: int = 128
    stats_dir: str | None = None  # covariance cache; None: $ICLRKIT_CACHE_DIR/edit-stats or ~/.cache/iclrkit/...
    context_prefixes: int = 10  # model-generated prefixes added to the bare "{}" template
    prefix_tokens: int = 10
    v_num_grad_steps: int = 25
    v_lr: float = 0.5
    kl_factor: float = 0.0625  # KL on "{subject} is a" keeps the subject's essence
    v_weight_decay: float = 0.5  # MEMIT's wd · ‖δ‖ / ‖h‖²
    init: Literal["zero", "target"] = "zero"  # δ start: 0, or EAMET's ‖k‖·h/‖h‖ (when ‖h‖ < 100)
    clamp: Literal["h", "ks"] = "h"  # project ‖δ‖ ≤ clamp_factor·‖h‖ (MEMIT) or ·‖k‖ (EAMET fix_ks)
    clamp_factor: float = 0.75
    early_stop_loss: float = 5e-2  # a request stops once its loss is below this
    batch_size: int | None = None  # sequential batched editing: requests per MEMIT update (None: all at once)
    opt_batch: int = 32  # MEMIT: requests whose δ are optimised together (EAMET: one at a time, see optimise_values)
    eval_batch: int = 64
    eval_before: bool = True  # also score the unedited model (baselines)
    fluency_samples: int = 50  # requests whose generation prompts are sampled for the n-gram entropy
    fluency_tokens: int = 50
    save_model: bool = True
    values: str | None = None  # values.safetensors of an earlier run (same model, facts, templates, layers): skip δ

    @field_validator("layers", mode="before")
    @classmethod
    def _comma_separated(cls, value):
        """`--layers 3,4` and `--set layers=3,4` arrive as text."""
        if isinstance(value, str):
            try:
                return [int(part) for part in value.split(",") if part.strip()]
            except ValueError:
                raise ValueError(f"expected comma-separated integers, got {value!r}") from None
        return value
