"""The configs of `iclrkit merge ...` (light to import: the CLI builds its options from these fields, each knob
declared once here) and the options a registered tensor-by-tensor merge method reads (`MergeOptions`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from toolkit.core.config import BaseConfig

MODELS_HOW = "--model repeated and/or comma separated (--models is the same); a folder of model dirs expands."


def models_field(what: str) -> Any:
    """The merged models: `--model/--models/-m`, repeatable and comma separated (toolkit.merge.models expands it)."""
    return Field(default_factory=list, description=f"{what}: {MODELS_HOW}",
                 json_schema_extra={"flag": "--model", "short": "-m", "aliases": ["--models"]})


def weights_field(description: str, signed: bool = False) -> Any:
    """Comma-separated per-model weights: `list[Weight]` (>= 0), or any finite value with signed=True."""
    return Field(None, description=description, json_schema_extra={"style": "comma", **({"signed": True} if signed
                                                                                       else {})})


Weight = Annotated[float, Field(ge=0)]  # a merge weight of one model


@dataclass(frozen=True)
class MergeOptions:
    """What a tensor-by-tensor merge method may read (each reads its own): per-model weights, the task-vector
    scaling λ, the TIES density (one, or `densities` per model) and mergekit's `normalize`."""

    weights: list[float] | None = None
    scaling: float = 1.0
    density: float = 0.2
    densities: list[float] | None = None
    normalize: bool = True


class StreamingFields(BaseConfig):
    """How the same-size merges read and write: streamed tensor by tensor from local safetensors directories."""

    stream: bool | None = Field(None, description="Stream one tensor at a time from the safetensors files (default: "
                                                  "when every model is a local safetensors directory not scored "
                                                  "on a held-out text).")
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = Field(
        "auto", description="Output dtype; auto = the inputs' dtype when streaming (float32 otherwise).")


class AverageConfig(StreamingFields):
    """Weight averaging (model soup) of same-size models."""

    method: Literal["average"] = "average"
    models: list[str] = models_field("Models to merge (paths or zoo:NAME)")
    weights: list[Weight] | None = weights_field("Merge weight per model (normalised); default uniform.")

    def options(self) -> MergeOptions:
        return MergeOptions(weights=self.weights)


class TaskVectorFields(StreamingFields):
    """The merges of task vectors τᵢ = θᵢ − θ_base: the fine-tuned models and their common base."""

    models: list[str] = models_field("Fine-tuned models")
    base: str = Field(..., description="The common pre-trained model the task vectors are taken from.")


class TaskArithmeticConfig(TaskVectorFields):
    """Task arithmetic (Ilharco et al., ICLR 2023, https://arxiv.org/abs/2212.04089): θ_base + λ Σ (θ_i − θ_base)."""

    method: Literal["task-arithmetic"] = "task-arithmetic"
    scaling: float = Field(1.0, ge=0.0, description="λ, the task-vector scaling (paper: tuned on validation).")

    def options(self) -> MergeOptions:
        return MergeOptions(scaling=self.scaling)


class TiesConfig(TaskVectorFields):
    """TIES-Merging (Yadav et al., NeurIPS 2023, https://arxiv.org/abs/2306.01708; github.com/prateeky2806/ties-merging)."""

    method: Literal["ties"] = "ties"
    density: float = Field(0.2, gt=0.0, le=1.0, description="Fraction k of each task vector kept (paper: top 20%).")
    scaling: float = Field(1.0, ge=0.0, description="λ applied to the merged task vector (paper: 1).")

    def options(self) -> MergeOptions:
        return MergeOptions(scaling=self.scaling, density=self.density)


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
