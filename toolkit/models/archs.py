"""What discovery cannot tell about an architecture, as data (everything else `toolkit.models.view` finds from the
model itself: blocks, linears, their order and grouping, norms and their kinds, embeddings, head).

- how a fused q/k/v projection orders its rows (the head-wise V/O rotation needs the value rows);
- the architecture name llama.cpp gives it (GGUF export) and how its tensors are named there;
- which module names are routers (kept in float unless asked).
"""

from __future__ import annotations

from dataclasses import dataclass

ROUTER_NAMES = ("gate", "router", "shared_expert_gate")  # a Linear of this name routes tokens (MoE), not a projection
ATTENTION_NAMES = ("self_attn", "attn", "attention", "self_attention")


@dataclass(frozen=True)
class Traits:
    # rows of a fused q/k/v projection: "concat" = [q (heads·d) | k (kv·d) | v (kv·d)]; "per-head" = interleaved
    # (q_h, k_h, v_h) per head (GPT-NeoX, BLOOM); None = no fused q/k/v known for this model type
    qkv_layout: str | None = None
    gguf_arch: str | None = None  # llama.cpp's name; None = llama.cpp has no loader for it (export refused)
    # why transformers cannot reload a compressed-tensors checkpoint of this architecture (export refused), if so
    compressed_tensors_blocker: str | None = None


TABLE: dict[str, Traits] = {
    "llama": Traits(gguf_arch="llama"),
    "mistral": Traits(gguf_arch="llama"),
    "qwen2": Traits(gguf_arch="qwen2"),
    "qwen3": Traits(gguf_arch="qwen3"),
    "qwen2_moe": Traits(gguf_arch="qwen2moe"),
    "qwen3_moe": Traits(gguf_arch="qwen3moe"),
    "mixtral": Traits(gguf_arch="llama"),
    "olmoe": Traits(gguf_arch="olmoe"),
    "phi3": Traits(qkv_layout="concat", gguf_arch="phi3"),
    "phi": Traits(gguf_arch="phi2"),
    "gemma": Traits(gguf_arch="gemma"),
    "gemma2": Traits(gguf_arch="gemma2"),
    "gemma3_text": Traits(gguf_arch="gemma3"),
    "gemma3": Traits(gguf_arch="gemma3"),
    "olmo2": Traits(gguf_arch="olmo2"),
    "granite": Traits(gguf_arch="granite"),
    "cohere": Traits(gguf_arch="command-r"),
    "starcoder2": Traits(gguf_arch="starcoder2"),
    "stablelm": Traits(gguf_arch="stablelm"),
    "smollm3": Traits(gguf_arch="smollm3"),
    "exaone4": Traits(gguf_arch="exaone4"),
    "falcon": Traits(gguf_arch="falcon", compressed_tensors_blocker=(
        "transformers cannot reload it: FalconModel._init_weights reads FalconLinear.weight, which the format's "
        "packed tensors replace (transformers 5.24)")),
    "gpt_neox": Traits(qkv_layout="per-head", gguf_arch="gptneox"),
    "gptj": Traits(gguf_arch="gptj"),
    "opt": Traits(),
    "gpt2": Traits(qkv_layout="concat", gguf_arch="gpt2"),
    "bloom": Traits(qkv_layout="per-head", gguf_arch="bloom"),
    "bert": Traits(gguf_arch="bert"),
}


def traits(model_type: str | None) -> Traits:
    return TABLE.get(model_type or "", Traits())


LOGIT_TRANSFORMS = {"final_logit_softcapping": None, "logit_scale": 1.0, "logits_scaling": 1.0}  # attr: no-op value


def logit_transforms(config) -> list[str]:
    """The config's transforms of the logits after the head (Gemma 2 soft-capping, Cohere's logit_scale, Granite's
    logits_scaling) that are active: a head applied by hand must apply them too."""
    config = getattr(config, "text_config", None) or config
    return [name for name, neutral in LOGIT_TRANSFORMS.items()
            if getattr(config, name, neutral) not in (neutral, None)]
