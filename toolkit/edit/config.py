"""MEMIT's config (EAMET extends it): torch-free, so the CLI can build options from it.

The edit methods are registered in toolkit/edit/methods/ (one module each, `@register("edit", NAME, config=...)`);
a method's config is MemitConfig or a subclass whose `method` names it."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from toolkit.core.config import BaseConfig
from toolkit.core.fields import BlockIndex, data_field, onload_field
from toolkit.core.registry import declare

declare("edit", "toolkit.edit.methods")  # every module there registers its method(s)

# the config fields every edit command offers as flags (a method adds its own, e.g. EAMET's tau and top_m)
BASE_FLAGS = ["data", "model", "n_edits", "layers", "batch_size", "mom2_update_weight", "cov_data", "v_num_grad_steps",
              "values"]


class MemitConfig(BaseConfig):
    """MEMIT with the hyperparameters of the official LLaMA configs (EAMET repo's MEMIT baseline).

    Paper https://arxiv.org/abs/2210.07229, code https://github.com/kmeng01/memit."""

    method: Literal["memit"] = "memit"  # the registered edit method (toolkit/edit/methods/); each command sets its own
    model: str = Field(description="Model: local path, hub id, or zoo:NAME (default: an EasyEdit --config's "
                                   "model_name).", json_schema_extra={"short": "-m"})
    data: str = data_field(..., description="Facts: CounterFact/zsRE .json (ROME or EasyEdit schema) or .jsonl "
                                            "{prompt, subject, target_new}.")
    n_edits: int | None = Field(None, ge=1, description="Edit the first N facts (default: all).",
                                json_schema_extra={"short": "-n"})
    # None: [3, 4] with >= 8 blocks, else the middle two
    layers: list[BlockIndex] | None = Field(None, description="Edit layers, e.g. 3,4.",
                                     json_schema_extra={"style": "comma"})
    mom2_update_weight: float = Field(15000.0, ge=0, description="λ of the covariance term (λC + KKᵀ).",
                                      json_schema_extra={"flag": "--mom2-weight"})
    cov_data: str = Field("embedded", description="Text for the key covariance C = E[kkᵀ]: .txt, .jsonl[:field], "
                                                  "embedded, hub id.")
    cov_tokens: int = 100_000  # tokens streamed for C
    cov_seqlen: int = 128
    stats_dir: str | None = None  # covariance cache; None: $ICLRKIT_CACHE_DIR/edit-stats or ~/.cache/iclrkit/...
    # the covariance pass block by block (toolkit/edit/covariance.py key_covariance_onloaded); the edit itself then
    # loads the whole model
    onload: bool = onload_field()
    context_prefixes: int = 10  # model-generated prefixes added to the bare "{}" template
    prefix_tokens: int = 10
    v_num_grad_steps: int = Field(25, ge=1, description="Value optimisation steps per fact.",
                                  json_schema_extra={"flag": "--steps"})
    v_lr: float = 0.5
    kl_factor: float = 0.0625  # KL on "{subject} is a" keeps the subject's essence
    v_weight_decay: float = 0.5  # MEMIT's wd · ‖δ‖ / ‖h‖²
    init: Literal["zero", "target"] = "zero"  # δ start: 0, or EAMET's ‖k‖·h/‖h‖ (when ‖h‖ < 100)
    clamp: Literal["h", "ks"] = "h"  # project ‖δ‖ ≤ clamp_factor·‖h‖ (MEMIT) or ·‖k‖ (EAMET fix_ks)
    clamp_factor: float = 0.75
    early_stop_loss: float = 5e-2  # a request stops once its loss is below this
    batch_size: int | None = Field(None, ge=1, description="Sequential batched editing: facts per update (default: all "
                                                     "in one update).")
    opt_batch: int = 32  # MEMIT: requests whose δ are optimised together (EAMET: one at a time, see optimise_values)
    eval_batch: int = 64
    eval_before: bool = True  # also score the unedited model (baselines)
    fluency_samples: int = 50  # requests whose generation prompts are sampled for the n-gram entropy
    fluency_tokens: int = 50
    save_model: bool = True
    values: str | None = Field(None, description="Reuse the δ of an earlier run (its out dir or values.safetensors; "
                                                 "same model, facts, layers): redo only the insertion, e.g. to sweep "
                                                 "λ.")

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


class EametConfig(MemitConfig):
    """EAMET defaults from the official hparams/EAMET/*.json (LLaMA3-8B λ, clamp of LLaMA2/3) and general.sh."""

    method: Literal["eamet"] = "eamet"
    mom2_update_weight: float = 15000.0
    init: Literal["zero", "target"] = "target"
    clamp: Literal["h", "ks"] = "ks"
    clamp_factor: float = 2.0  # clamp_ks_factor
    v_weight_decay: float = 0.0  # norm_factor = 0: only the projection bounds ‖δ‖
    early_stop_loss: float = 1e-2
    cs_factor: float = Field(2.0, ge=0, description="Weight of KL(P_k ‖ P_r) (cs_factor).",
                             json_schema_extra={"flag": "--align-kl"})
    mse_factor: float = Field(8.0, ge=0, description="Weight of the top-M weighted MSE (mse_factor).",
                              json_schema_extra={"flag": "--align-mse"})
    tau: float = Field(0.07, gt=0, description="Softmax temperature of the similarities.")
    top_m: int = Field(50, ge=1, description="Key neighbours in the weighted MSE.")
