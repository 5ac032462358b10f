"""The configs of the built-in compression methods and the knobs every method shares (torch-free: the CLI builds
each command's options from their fields).

Every method shares CompressConfig's knobs, so one recipe compares methods fairly; a method adds only its own. The
methods themselves are registered in toolkit/compress/methods/, and a new method may declare its config there,
beside its function (methods/magnitude.py does). A method that reads the job's mask (LinearJob.mask) has a config
with a `mask` field (MaskedConfig).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from toolkit.core.config import BaseConfig
from toolkit.core.fields import Count, data_field, model_field, onload_field
from toolkit.core.registry import declare

declare("compress", "toolkit.compress.methods")  # every module there registers its method(s)
declare("compress-stage", "toolkit.compress.methods")  # ... and its recipe stage(s) (toolkit/compress/stages.py)

# the config fields every compress command offers as flags (a method adds its own, e.g. OBR's alpha and mode)
BASE_FLAGS = ["model", "data", "eval_data", "w_bits", "a_bits", "kv_bits", "kv_quant", "sparsity", "nm", "group_size",
              "nsamples", "seqlen", "rotate"]

# the KV-cache quantizer (toolkit.compress.quant.kv_quant_params): token-sym = QuaRot's KV4 (symmetric, one scale per
# token over all KV heads); head-asym = asymmetric min/max per token and head (the only scheme before 2026-12-03)
KvQuant = Literal["token-sym", "head-asym"]


class CompressConfig(BaseConfig):
    """Knobs every method shares, so one recipe compares methods fairly."""

    model: str = model_field()
    data: str | None = data_field(description="Calibration text: .txt, .jsonl[:field], 'embedded', or a hub "
                                              "dataset id.")
    eval_data: str | None = Field(None, description="Text for perplexity after compression (skipped when absent).")
    method: str = "rtn"  # the registered method (toolkit/compress/methods/); each command sets its own
    w_bits: int = Field(4, description="Weight bits (2-8; 16 = float), symmetric.")
    # a ragged last group when in_features is not a multiple
    group_size: int | None = Field(None, gt=0, description="Input columns per weight scale (e.g. 32, 64, 128); "
                                                            "omit for one scale per output channel.")
    # lm_head stays 16-bit; simulated on CPU
    a_bits: int = Field(16, description="Activation bits, per token, for every block linear (2-8; 16 = off).")
    kv_bits: int = Field(16, description="KV-cache bits (K after RoPE, V) (2-8; 16 = off).")
    kv_quant: KvQuant = Field("token-sym", description="KV-cache quantizer: token-sym (QuaRot: symmetric, one scale "
                                                       "per token over all heads) | head-asym (asymmetric, per token "
                                                       "and head).")
    sparsity: float = Field(0.0, ge=0, lt=1, description="Unstructured sparsity per output row, [0, 1).")
    nm: str | None = Field(None, description="N:M structured sparsity, e.g. 2:4 or 4:8 (overrides --sparsity).")
    nsamples: int = Field(128, gt=0, description="Calibration windows.")
    seqlen: int = Field(2048, gt=1, description="Tokens per calibration window (capped at the model's context).")
    percdamp: float = Field(0.01, ge=0)  # Hessian damping, as a share of mean(diag H); escalates ×10 on failure
    blocksize: int = Field(128, gt=0)  # GPTQ/SparseGPT lazy-batch width
    # MSE clip search for the weight scales (grid 100, max shrink 0.8, norm 2.4); None = auto: on for rotated
    # models, off (min-max) on unrotated ones — measured on SmolLM2 W4A16 GPTQ (examples/obr/RESULTS.md, issue 32)
    w_clip: bool | None = None
    # the clip search's scan: full = all 80 ratios (GPTQ's reference); coarse = every 4th, then each row's best
    # neighbourhood (26 error passes, ~3x faster; the same ratio for ~98.5 % of rows, issue 32)
    w_clip_search: Literal["full", "coarse"] = "full"
    # the unclipped scale: max|w|/(2^{b-1}-1) ("signed": GPTQ's reference, code -2^{b-1} unused) or
    # max|w|/(2^{b-1}-1/2) ("full": llm-compressor / compressed-tensors' min-max, all 2^b codes in use);
    # auto: full with min-max scales, signed under the clip search
    w_range: Literal["auto", "signed", "full"] = "auto"
    a_clip_ratio: float = Field(1.0, gt=0, le=1)
    rotate: bool | None = Field(None, description="QuaRot rotation (default: on for RMSNorm models, off with a "
                                                  "note otherwise).")
    rotation_seed: int = 0
    # how each rotation is built: auto = an exact Hadamard where one is constructed for the width (Sylvester x
    # Paley), else H_p (x) random orthogonal; exact = bad input where none is; kron-orthogonal = H_p (x) random
    # orthogonal everywhere (the construction before exact Hadamards; issue 32 measures both)
    rotation_kind: Literal["auto", "exact", "kron-orthogonal"] = "auto"
    eval_max_length: int = Field(2048, gt=1)
    eval_windows: int | None = Field(None, gt=0)
    # compressed-tensors / gguf: packed/ plus that format (weight-only W4A16; see toolkit/export)
    export: Literal["both", "packed", "dense", "none", "compressed-tensors", "gguf"] = "both"
    # token embeddings + LM head: 16 keeps them float16 as OBR does; 8 or 4 rounds them to a grouped integer grid
    # (in the model, so perplexity includes it, and in the packed file): most of a small model's packed bytes
    embed_bits: Literal[4, 8, 16] = 16
    embed_group: int = Field(64, gt=0)  # columns per scale of the embeddings / LM head
    solve_dtype: Literal["float32", "float64"] = "float32"  # Hessian accumulation and solves
    # True: each sequential group is calibrated on inputs that went through the groups already compressed (one
    # stopped forward per group, GPTQ's --true-sequential); False: one forward per block for all groups (as
    # llm-compressor does): about a third less forward work, the groups see the block's uncompressed weights
    true_sequential: bool = True
    # true_sequential in ONE forward per block: every window goes through the block as one batch and each group is
    # compressed in a pre-hook as its input arrives, so later groups see the compressed earlier ones (the inputs of
    # one stopped forward per group) and the block's output is already the propagated one (no second forward).
    # auto: always when that batch's workspace fits memory.FUSED_WORKSPACE_LIMIT, else one window at a time
    fused_calibration: Literal["auto", "always", "never"] = "auto"
    onload: bool = onload_field()  # toolkit/compress/onloaded.py
    # mixture-of-experts models (fused expert tensors): each expert's gate/up and down projections get their own
    # Hessian from the tokens the router sends them (routed) or from every token (all: llm-compressor's answer for
    # rarely routed experts); an expert with fewer than moe_min_tokens routed tokens gets moe_fallback (all-token
    # calibration, or RTN with no Hessian) and a warning, or (refuse) the run stops with exit 2 naming them;
    # run.json lists every expert's token count
    moe_calibration: Literal["routed", "all"] = "routed"
    moe_min_tokens: int = Field(1, ge=0)
    moe_fallback: Literal["all-tokens", "rtn", "refuse"] = "all-tokens"
    # routers (and Qwen2-MoE's shared-expert gate) stay in float unless asked: a wrong route costs more than the bytes
    quantize_routers: bool = False

    def fused_calibration_fits(self, nsamples: int, seqlen: int, dims: tuple[int, int, int]) -> bool:
        """Whether the layer loop calibrates each block in one batched forward: fused_calibration=always, or auto
        with true_sequential and the batch's workspace (`dims` = memory.block_dims) within FUSED_WORKSPACE_LIMIT."""
        from toolkit.models.memory import FUSED_WORKSPACE_LIMIT, batched_workspace

        if not self.true_sequential or self.fused_calibration == "never":
            return False
        return self.fused_calibration == "always" or batched_workspace(nsamples, seqlen, *dims, 4) <= \
            FUSED_WORKSPACE_LIMIT

    @field_validator("w_bits", "a_bits", "kv_bits")
    @classmethod
    def _bits(cls, value: int) -> int:
        if not (2 <= value <= 8 or value == 16):
            raise ValueError(f"bits must be in 2..8 (or 16 = not quantized), got {value}")
        return value

    @field_validator("sparsity")
    @classmethod
    def _sparsity(cls, value: float) -> float:
        from toolkit.compress.masks import sparsity_problem

        problem = sparsity_problem(value)
        if problem:
            raise ValueError(problem)
        return value

    @field_validator("nm")
    @classmethod
    def _nm(cls, value: str | None) -> str | None:
        from toolkit.compress.masks import parse_nm

        try:
            parse_nm(value)
        except Exception as exc:  # noqa: BLE001 - pydantic wants ValueError
            raise ValueError(str(exc)) from None
        return value


def resolve_defaults(config, rotate: bool, ctx=None):
    """The rotation-dependent defaults, measured on SmolLM2 W4A16 GPTQ (examples/obr/RESULTS.md): actorder=auto →
    static unrotated, none rotated; w_clip=None → the MSE clip search rotated, min-max unrotated; w_range=auto →
    full with min-max scales, signed under the clip search. The effective values are recorded in the metrics."""
    update = {}
    if getattr(config, "actorder", None) == "auto":
        update["actorder"] = "none" if rotate else "static"
    if getattr(config, "w_clip", False) is None:  # a recipe stage's own small config may have no grid knobs
        update["w_clip"] = bool(rotate)
    if getattr(config, "w_range", None) == "auto":
        update["w_range"] = "signed" if update.get("w_clip", config.w_clip) else "full"
    config = config.model_copy(update=update)
    if ctx is not None:
        ctx.metrics.update(update)
    return config


ActOrder = Literal["auto", "none", "static", "weight", "group"]


class _Ordered(CompressConfig):
    """GPTQ's column order (`actorder`, GPTQ and the two-stage baseline only; OBR's official code defines none):
    - none: columns in their natural order (the original GPTQ);
    - static / weight (llm-compressor: "static" is an alias of "weight"): columns processed in decreasing diag(H),
      scales fitted on the un-permuted weights, groups of consecutive original columns; the stored format is
      unchanged;
    - group (llm-compressor's deprecated "group"/"dynamic"): groups are runs of the activation-ordered columns,
      scales fitted on the permuted weights; the packed file stores each column's group (`g_idx`). Needs
      `group_size`;
    - auto (the default): static on unrotated models, none on rotated ones (resolve_defaults below), as measured
      on SmolLM2 W4A16 (examples/obr/RESULTS.md: ordering 70.48 → 55.75 ppl unrotated, 41.66 → 43.16 rotated)."""

    # auto (measured on SmolLM2 W4A16, examples/obr/RESULTS.md): static on unrotated models (55.7 vs 70.5 ppl),
    # none on rotated ones (QuaRot flattens diag(H); ordering measured worse there)
    actorder: ActOrder = Field("auto", description="GPTQ column order: auto (default: static unrotated, none "
                                                   "rotated) | static (decreasing Hessian diagonal) | weight "
                                                   "(= static) | group (groups follow the order; needs "
                                                   "--group-size) | none.")

    @model_validator(mode="after")
    def _group_needs_groups(self):
        if self.actorder == "group" and self.group_size is None:
            raise ValueError("actorder=group needs grouped scales: set --group-size (e.g. 128)")
        return self


class MaskedConfig(CompressConfig):
    """A method that prunes with the job's mask (LinearJob.mask: these scores at --sparsity / --nm) before its own
    solve."""

    mask: Literal["magnitude", "wanda"] = "magnitude"  # the mask's scores: |W|, or Wanda's |W|·‖x‖


class RtnConfig(MaskedConfig):
    """`iclrkit compress rtn`: per-channel symmetric round-to-nearest; with --sparsity, magnitude mask first."""

    method: Literal["rtn"] = "rtn"


class GptqConfig(_Ordered, MaskedConfig):
    """`iclrkit compress gptq`: GPTQ (blocksize 128, 1% damping, activation ordering); with --sparsity, a fixed mask
    first."""

    method: Literal["gptq"] = "gptq"


class SparsegptConfig(CompressConfig):
    """`iclrkit compress sparsegpt`: SparseGPT 50% with joint GPTQ quantization (the paper's baseline)."""

    method: Literal["sparsegpt"] = "sparsegpt"
    sparsity: float = 0.5


class WandaConfig(MaskedConfig):
    """`iclrkit compress wanda`: Wanda mask (|W|·‖x‖) then RTN."""

    method: Literal["wanda"] = "wanda"
    sparsity: float = 0.5
    mask: Literal["wanda"] = "wanda"


class SparsegptGptqConfig(_Ordered):
    """`iclrkit compress sparsegpt-gptq`: the two-stage baseline, SparseGPT 50% → refit scales → GPTQ (mask kept):
    the recipe [sparsegpt, gptq] (toolkit/compress/stages.py) with this config's knobs, kept as a command."""

    method: Literal["sparsegpt-gptq"] = "sparsegpt-gptq"
    sparsity: float = 0.5


class ObrConfig(MaskedConfig):
    """`iclrkit compress obr`: defaults are the paper's W4A4KV4 + 50% unstructured recipe (QuaRot rotation,
    Wanda mask, α = 0.5, OBR_GPTQ, 128 calibration windows of 2048 tokens, 1% damping)."""

    method: Literal["obr"] = "obr"
    sparsity: float = 0.5
    a_bits: int = 4
    kv_bits: int = 4
    mask: Literal["wanda", "magnitude"] = "wanda"
    alpha: float = Field(0.5, ge=0, le=1, description="Share of input columns (by position) whose quantization error is "
                                          "compensated in closed form, [0, 1].")
    mode: Literal["gptq", "rtn"] = Field("gptq", description="Final quantizer: gptq (OBR_GPTQ) | rtn (OBR_RTN).")
    # how the per-row systems H_RR x = b are solved (toolkit/compress/solvers.restricted_solve): cg = conjugate
    # gradients on all rows at once, preconditioned by a deflation model of H (its top eigenvectors, issue 42),
    # stopped when the layer loss is within solver_tol (relative) of its optimum; cholesky = exact, one batched
    # Cholesky of H_RR per row (~8-10x slower on SmolLM2's down_proj, examples/scale/RESULTS.md)
    solver: Literal["cg", "cholesky"] = "cg"
    solver_tol: float = Field(1e-3, gt=0, lt=1)


class BenchConfig(BaseConfig):
    """`iclrkit compress bench`: the INT4 kernels (OBR, https://arxiv.org/abs/2509.11177; official repo csguoh/OBR)
    against torch FP32. model: a `compress obr` packed directory (its `packed/` sub-folder also accepted), or
    None to time the GEMMs only. The paper's claim is a CUTLASS A100 micro-benchmark; this is the CPU version.
    (Declared here, torch-free, so the CLI builds `compress bench`'s options from it; run: int4_bench.run_bench.)"""

    model: str | None = Field(None, description="Packed model directory from `compress obr` (omit to time the GEMMs "
                                                "only).", json_schema_extra={"short": "-m"})
    n: int = Field(4096, ge=1, description="GEMM output features.")
    k: int = Field(4096, ge=1, description="GEMM input features.")
    rows: list[Count] = Field(default_factory=lambda: [1, 32], description="Token counts m (repeatable).")
    repeats: int = Field(10, ge=1, description="Interleaved timing rounds (best of).")
    a_bits: int = Field(8, ge=2, le=16, description="Per-token activation bits (8 = W4A8, 4 = W4A4, 16 = W4A16 "
                                                   "weight-only, model comparison only).")
    prompt_tokens: int = Field(32, ge=1, description="Prefill length for the model comparison.")
    new_tokens: int = Field(16, ge=1, description="Decoded tokens per model timing.")
    model_repeats: int = Field(2, ge=1, description="Model timing rounds (best of).")

    @field_validator("a_bits")
    @classmethod
    def _known_a_bits(cls, a_bits: int) -> int:
        if 8 < a_bits < 16:
            raise ValueError("a_bits must be 2..8 (W4A8/W4A4 integer kernels) or 16 (W4A16 weight-only)")
        return a_bits

    @field_validator("rows")
    @classmethod
    def _positive_rows(cls, rows: list[int]) -> list[int]:
        if not rows or min(rows) < 1:
            raise ValueError("rows must be a non-empty list of positive token counts")
        return rows
