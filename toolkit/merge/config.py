"""The configs of `iclrkit merge ...` (light to import: the CLI builds its options from these fields, each knob
declared once here, and a registered tensor-by-tensor method reads its knobs straight from its config).

A scalar knob of a tensor-by-tensor merge (`t`, `scaling`, `density`, a per-model weight, ...) may also be a
*gradient*, as in mergekit: a list of values interpolated over the layers (the first value at block 0, the last at
the last block, linearly between; tensors outside the blocks take the first value): `toolkit.merge.common.Site.at`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator

from toolkit.core.config import BaseConfig
from toolkit.core.fields import signed
from toolkit.core.registry import declare

declare("merge", "toolkit.merge.methods")  # every module there registers its method(s)

MODELS_HOW = "--model repeated and/or comma separated (--models is the same); a folder of model dirs expands."
# a number, or a gradient over the layers (mergekit's list form)
Scalar = Union[float, list[float]]
Share = Annotated[float, Field(gt=0, le=1)]  # a fraction kept: (0, 1]
ShareScalar = Union[Share, list[Share]]  # ... or its gradient over the layers
Margin = Annotated[float, Field(ge=0, lt=1)]  # a fraction dropped or a half-width: [0, 1)
MarginScalar = Union[Margin, list[Margin]]
# the flags every same-size tensor merge offers besides its own knobs
TENSOR_FLAGS = ["numerics"]


def models_field(what: str) -> Any:
    """The merged models: `--model/--models/-m`, repeatable and comma separated (toolkit.merge.models expands it)."""
    return Field(default_factory=list, description=f"{what}: {MODELS_HOW}",
                 json_schema_extra={"flag": "--model", "short": "-m", "aliases": ["--models"]})


def weights_field(description: str, signed: bool = False) -> Any:
    """Comma-separated per-model weights: `list[Weight]` (>= 0), or any finite value with signed=True."""
    return Field(None, description=description, json_schema_extra={"style": "comma", **({"signed": True} if signed
                                                                                       else {})})


Weight = Annotated[float, Field(ge=0)]  # a merge weight of one model


class StreamingFields(BaseConfig):
    """How the same-size merges read and write: streamed tensor by tensor from local safetensors directories."""

    stream: bool | None = Field(None, description="Stream one tensor at a time from the safetensors files (default: "
                                                  "when every model is a local safetensors directory not scored "
                                                  "on a held-out text).")
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = Field(
        "auto", description="Output dtype; auto = the inputs' dtype when streaming (float32 otherwise).")


class TensorMergeConfig(StreamingFields):
    """Knobs every tensor-by-tensor merge shares (toolkit/merge/methods/: one function per tensor)."""

    method: str = "average"  # the registered merge method; each config class pins its own
    models: list[str] = models_field("Models to merge (paths or zoo:NAME)")
    weights: list[Scalar] | None = weights_field("Merge weight per model; default: the same for every model.",
                                                 signed=True)
    numerics: Literal["float64", "mergekit"] = Field(
        "float64", description="float64: every merge computed in float64, rounded once to the output dtype (the "
                               "default: correctly rounded); mergekit: computed as mergekit 0.1.5 does, in the "
                               "models' dtype (--set compute_dtype) with its order of operations, for "
                               "byte-identical results.")
    # numerics=mergekit only: the dtype mergekit loads and computes in (its YAML `dtype`); auto = the output dtype
    compute_dtype: Literal["auto", "float32", "float16", "bfloat16"] = "auto"

    @field_validator("t", "scaling", "density", "epsilon", "gamma", mode="before", check_fields=False)
    @classmethod
    def _gradient_text(cls, value):
        """`--t 0,0.5,1` (and `--set t=0,0.5,1`) arrive as text: a gradient."""
        if isinstance(value, str) and "," in value:
            try:
                return [float(part) for part in value.split(",") if part.strip()]
            except ValueError:
                raise ValueError(f"expected a number or comma-separated numbers, got {value!r}") from None
        return value


class AverageConfig(TensorMergeConfig):
    """Weight averaging (model soup) of same-size models; mergekit's `linear`."""

    method: Literal["average"] = "average"
    weights: list[Scalar] | None = weights_field("Merge weight per model (normalised); default uniform.",
                                                 signed=True)
    # false: Σ wᵢ θᵢ as given (mergekit's `normalize: false`); true: divided by Σ wᵢ
    normalize: bool = True


class TaskVectorFields(TensorMergeConfig):
    """The merges of task vectors τᵢ = θᵢ − θ_base: the fine-tuned models and their common base."""

    models: list[str] = models_field("Fine-tuned models")
    base: str = Field(..., description="The common pre-trained model the task vectors are taken from.")
    scaling: Scalar = Field(1.0, description="λ, the scaling of the merged task vector (mergekit's `lambda`).", json_schema_extra=signed())
    normalize: bool = False  # divide the merged task vector by the summed weights (of the agreeing models, TIES)


class TaskArithmeticConfig(TaskVectorFields):
    """Task arithmetic (Ilharco et al., ICLR 2023, https://arxiv.org/abs/2212.04089): θ_base + λ Σ (θ_i − θ_base)."""

    method: Literal["task-arithmetic"] = "task-arithmetic"
    scaling: Scalar = Field(1.0, description="λ, the task-vector scaling (paper: tuned on validation).", json_schema_extra=signed())


class SparsifiedFields(TaskVectorFields):
    """Task-vector merges that first drop entries of each τᵢ (TIES, DARE, DELLA, breadcrumbs)."""

    density: ShareScalar = Field(0.2, description="Fraction k of each task vector kept, (0, 1].")
    densities: list[Scalar] | None = None  # per model (mergekit's per-model density); None: `density` for all
    rescale: bool = False  # scale each sparsified τ back to its L1 norm (mergekit's `rescale`)


class TiesConfig(SparsifiedFields):
    """TIES-Merging (Yadav et al., NeurIPS 2023, https://arxiv.org/abs/2306.01708; github.com/prateeky2806/ties-merging)."""

    method: Literal["ties"] = "ties"
    density: ShareScalar = Field(0.2, description="Fraction k of each task vector kept (paper: top 20%).")
    scaling: Scalar = Field(1.0, description="λ applied to the merged task vector (paper: 1).", json_schema_extra=signed())
    normalize: bool = True


class DareConfig(SparsifiedFields):
    """DARE (Yu et al., ICML 2024, https://arxiv.org/abs/2311.03099): drop each τ entry with probability 1 − density,
    rescale the kept ones (as mergekit: to the task vector's L1 norm), then sum (dare-linear) or TIES' sign election
    (dare-ties). The drops are seeded per tensor and model from --seed."""

    method: Literal["dare-ties", "dare-linear"] = "dare-ties"
    density: ShareScalar = Field(0.5, description="Probability of keeping each task-vector entry, (0, 1].")
    rescale: bool = True


class DellaConfig(DareConfig):
    """DELLA (Deep et al., 2024, https://arxiv.org/abs/2406.11617): MagPrune keeps each entry with a probability
    that grows with its magnitude rank within its row (density ± epsilon), rescaled, then merged as TIES (della) or
    summed (della-linear)."""

    method: Literal["della"] = "della"
    epsilon: MarginScalar = Field(0.15, description="Half-width of the keep probabilities around the density.")
    normalize: bool = True


class DellaLinearConfig(DellaConfig):
    """DELLA's drops, then the weighted task vectors summed (mergekit's della_linear)."""

    method: Literal["della-linear"] = "della-linear"
    normalize: bool = False


class BreadcrumbsConfig(SparsifiedFields):
    """Model Breadcrumbs (Davari & Belilovsky, ECCV 2024, https://arxiv.org/abs/2312.06795): drop the largest
    `gamma` share of each task vector's magnitudes (outliers) and the smallest down to `density`, then sum
    (breadcrumbs) or TIES' sign election (breadcrumbs-ties)."""

    method: Literal["breadcrumbs", "breadcrumbs-ties"] = "breadcrumbs"
    density: ShareScalar = Field(0.9, description="Fraction of each task vector kept, (0, 1].")
    gamma: MarginScalar = Field(0.01, description="Fraction of the largest-magnitude entries dropped as outliers.")


class ModelStockConfig(TensorMergeConfig):
    """Model Stock (Jang et al., ECCV 2024, https://arxiv.org/abs/2403.19522): the fine-tuned models' average pulled
    towards the base by t = k·cosθ / (1 + (k−1)·cosθ), cosθ the mean pairwise cosine of their task vectors."""

    method: Literal["model-stock"] = "model-stock"
    models: list[str] = models_field("Fine-tuned models (at least two)")
    base: str = Field(..., description="The pre-trained model the fine-tuned ones started from.")
    filter_wise: bool = Field(False, description="One t per row (filter) instead of one per tensor.")


class SlerpConfig(TensorMergeConfig):
    """Spherical linear interpolation of two models (Shoemake 1985; mergekit's slerp): per tensor, along the great
    circle between the base and the other model; nearly collinear tensors are interpolated linearly."""

    method: Literal["slerp"] = "slerp"
    models: list[str] = models_field("The model interpolated towards (one)")
    base: str = Field(..., description="The model at t = 0.")
    t: Scalar = Field(0.5, description="Interpolation factor (0: base, 1: the other model); a list is a gradient "
                                       "over the layers.", json_schema_extra=signed({"style": "comma"}))


class PassthroughSource(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str
    layer_range: tuple[int, int]  # blocks [start, stop) of `model`
    scale: Scalar | None = None  # multiply the source's tensors (mergekit's passthrough `scale`; a list: gradient)


class PassthroughSlice(BaseModel):
    model_config = ConfigDict(extra="forbid")

    sources: list[PassthroughSource] = Field(min_length=1, max_length=1)


class PassthroughConfig(StreamingFields):
    """Stack block ranges of models into a new model (mergekit's passthrough with `slices`): the blocks of every
    slice in order, embeddings from the first slice's model, final norm and head from the last's."""

    method: Literal["passthrough"] = "passthrough"
    slices: list[PassthroughSlice] = Field(..., min_length=1, description="Block ranges, in output order: "
                                           "[{sources: [{model, layer_range: [start, stop]}]}] (YAML, via --config).")
    numerics: Literal["float64", "mergekit"] = "float64"
    compute_dtype: Literal["auto", "float32", "float16", "bfloat16"] = "auto"

    @property
    def models(self) -> list[str]:
        return list(dict.fromkeys(s.sources[0].model for s in self.slices))


class PaddedConfig(BaseConfig):
    """Different sizes: zero-pad/truncate each model to the target's shapes, then average (the naive baseline).
    Shallower models are first deepened with identity layers to the target's depth (deepen.py; deeper ones are
    refused). With align=true, the models are then projected by our dimensionality-matching projection: MLP units
    and CNN channels weight-matched to the target, GPT-2 widened function-preservingly (toolkit/merge/projection.py)."""

    models: list[str] = models_field("Models to merge (may differ in width and depth)")
    target: str | None = Field(None, description="Model whose shapes the merge takes (default: the deepest, "
                                                     "then largest).")
    weights: list[Weight] | None = weights_field("Merge weight per model; default uniform.")
    align: bool = Field(False, description="Weight-match MLP units / CNN channels (widen GPT-2) first.")
    fill: Literal["zero", "duplicate"] = Field("zero", description="With align, spare units of a widened MLP/CNN: "
                                               "zero units or copies of matched units.")


class LatentTrainConfig(BaseConfig):
    """Train the weight VAE on a zoo of checkpoints (defaults: the official config, sorobedio/ls-merge)."""

    models: list[str] = models_field("Zoo checkpoints")
    holdout: list[str] = Field(default_factory=list, description="Checkpoints only scored for reconstruction.",
                               json_schema_extra={"style": "comma"})
    target: str | None = Field(None, description="Model whose layout (sizes) every model is projected into "
                                                 "(needed if sizes differ).")
    align: bool = Field(True, description="Match hidden units to the target before encoding (MLPs).")
    fill: Literal["zero", "duplicate"] = Field("zero", description="Spare units of a widened MLP/CNN: zero units "
                                               "(exact) or copies of matched units (outgoing split; also exact).")
    exclude: list[str] = Field(["bias", "norm", "ln"], description="Name fragments kept out of the VAE (official).")
    chunk: int = Field(64, ge=8, description="Weights per token (official 640; 64 fits small MLP rows).")
    window: int = Field(16, ge=2, description="Tokens per VAE sequence (official 16).")
    d_model: int = Field(128, ge=16, description="Transformer width (official 768).")
    heads: int = Field(4, ge=1, description="Attention heads (official 4).")
    encoder_layers: int = Field(2, ge=1, description="Encoder blocks (official 4).")
    decoder_layers: int = Field(2, ge=1, description="Decoder blocks (official 4).")
    latent_dim: int = Field(64, ge=2, description="Latent size per token (stage 1 keeps one latent per token).")
    compression: int = Field(4, ge=1, description="Stage 2: window tokens per compact latent token (r).")
    max_layers: int = Field(64, ge=1, description="Size of the layer-embedding table.")
    stage1_steps: int = Field(2000, ge=1, description="Stage-1 optimiser steps.")
    stage2_steps: int = Field(1000, ge=0, description="Stage-2 (compact code) optimiser steps; 0 skips stage 2.")
    batch_size: int = Field(128, ge=1, description="Windows per step (official 128).")
    lr: float = Field(1e-4, gt=0, description="AdamW peak learning rate (official 1e-4).")
    warmup_steps: int = Field(500, ge=0, description="Linear warm-up steps (official 500; capped at a quarter of a "
                              "stage), then cosine to 0.")
    gradient_clip: float = Field(5.0, gt=0, description="Gradient-norm clip (official 5.0).")
    recon_weight: float = Field(1000.0, ge=0, description="Huber(δ=1) weight (official 1000).")
    mmd_weight: float = Field(10.0, ge=0, description="MMD weight (official 0.1·100).")
    kl_weight: float = Field(1e-4, ge=0, description="KL weight (official 1e-4).")
    distill_weight: float = Field(100.0, ge=0, description="Stage 2: L2 to the stage-1 latents.")
    checkpoint_every: int = Field(200, ge=1, description="Steps between --resume checkpoints.")


class LatentMergeConfig(BaseConfig):
    """Merge models by interpolating their VAE codes."""

    models: list[str] = models_field("Models to merge")
    vae: str = Field(..., description="VAE directory written by `iclrkit merge latent train`.")
    weights: list[float] | None = weights_field("Interpolation weight per model (λ); default uniform.", signed=True)
    interpolation: Literal["linear", "slerp"] = Field("linear", description="slerp needs exactly two models.")
    code: Literal["compact", "full"] = Field("compact", description="Stage-2 compact code or the stage-1 code.")
    target: str | None = Field(None, description="Layout to decode into (default: the VAE's training target, "
                                                 "else the largest parent).")
    align: bool | None = Field(None, description="Match units to the target first (default: as in training).")
    residual: bool = Field(True, description="Add back each parent's exact reconstruction residual "
                                             "W_i - decode(encode(W_i)), weighted by λ_i (false: the pure decode).")


class DigitsZooConfig(BaseConfig):
    """The merge zoo: digits MLPs (or CNNs) of several widths and inits, each fine-tuned on every sub-task."""

    kind: Literal["mlp", "cnn"] = Field("mlp", description="mlp: 64-h-...-10 MLPs; cnn: 3x3 conv stacks + linear head.")
    widths: list[int] = Field([64, 64, 32], description="Hidden width (MLP) or channels (CNN) of each backbone.")
    seeds: list[int] = Field([0, 1, 2], description="Init seed of each backbone (same length as widths).")
    depth: int = Field(2, ge=1, description="Hidden layers per MLP / convolutions per CNN.")
    tasks: dict[str, list[int]] = Field({"0to4": [0, 1, 2, 3, 4], "5to9": [5, 6, 7, 8, 9]},
                                        description="Sub-task name -> digit classes it is fine-tuned on.")
    backbone_epochs: int = Field(3, ge=1, description="Epochs on all ten classes for each backbone.")
    finetune_epochs: int = Field(6, ge=1, description="Fine-tuning epochs per sub-task (a snapshot after each).")
    lr: float = Field(1e-3, gt=0, description="Adam learning rate.")


class TextTask(BaseModel):
    model_config = ConfigDict(extra="forbid")

    train: str = Field(..., description="Training text (.txt/.jsonl[:field] or 'embedded').")
    heldout: str | None = Field(None, description="Held-out text; default: a 10% paragraph split of `train`.")


class LMZooConfig(BaseConfig):
    """Tiny GPT-2s (in-process configs like zoo:gpt2-tiny) of several widths, fine-tuned per text."""

    tasks: dict[str, TextTask] = Field(
        ..., min_length=2,
        description="Task name -> texts; the first two tasks are the merge pair's tasks A and B (the recipe: "
                    "examples/merge-latent/gpt2-zoo.yaml, WikiText-2 vs the embedded text).")
    widths: list[int] = Field([64, 128], description="n_embd of each backbone.")
    seeds: list[int] = Field([0, 1], description="Init seed of each backbone (same length as widths).")
    layers: int = Field(2, ge=1, description="Transformer blocks.")
    heads: int = Field(4, ge=1, description="Attention heads (the same for every width).")
    vocab: int = Field(512, ge=64, description="Shared BPE vocabulary size.")
    context: int = Field(128, ge=16, description="n_positions.")
    seqlen: int = Field(64, ge=8, description="Training and scoring window length.")
    batch: int = Field(16, ge=1, description="Windows per step.")
    backbone_steps: int = Field(300, ge=1, description="AdamW steps on both texts.")
    finetune_steps: int = Field(200, ge=1, description="AdamW steps on one text.")
    snapshot_every: int = Field(50, ge=1, description="Fine-tuning steps between snapshots.")
    lr: float = Field(3e-3, gt=0, description="Backbone peak learning rate (cosine, 20 warm-up steps).")
    finetune_lr: float = Field(1e-3, gt=0, description="Fine-tuning peak learning rate.")
    heldout_chars: int = Field(40_000, ge=1000, description="Held-out text kept for scoring (its first characters).")
    score_windows: int = Field(64, ge=1, description="Held-out windows scored per task.")
