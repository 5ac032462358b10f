"""What llama.cpp's loader for each architecture expects that the model itself does not say, as data (`LAYOUTS`, keyed
by llama.cpp's architecture name), the architectures it names but this writer refuses (`REFUSED`), and the config
readers the rest of the writer shares."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GgufLayout:
    """What llama.cpp's loader for one architecture expects that the model itself does not say."""

    norm: str = "rms"  # "rms": RMSNorm eps key (attention.layer_norm_rms_epsilon); "layer": LayerNorm (…_epsilon)
    rope: bool = True  # RoPE keys (dimension count, base); False: learned positions / ALiBi (GPT-2, BLOOM)
    permute_qk: bool = False  # llama.cpp's adjacent-pair RoPE on transformers' rotate-half rows: permute q/k rows
    qkv: str = "concat"  # fused q/k/v rows: "concat" (written as they are) | "grouped" (per KV group, regrouped)
    keys: tuple[str, ...] = ()  # extra metadata, by name in KEY_WRITERS
    checks: tuple[str, ...] = ()  # config conventions llama.cpp hard-codes, by name in CHECKS
    moe_norm_topk: bool | None = None  # llama.cpp renormalises the top-k routing weights (fixed per architecture)
    rope_factors: bool = False  # the loader reads a rope_freqs tensor (Llama-3 RoPE scaling is written as one)
    sliding: str = "ignored"  # "pattern": window + per-layer pattern honoured; "ignored": full attention everywhere
    query_scale_27b: int | None = None  # Gemma: attention scale 1/√head_dim, 1/√(hidden/heads) at this depth (27B)


LAYOUTS: dict[str, GgufLayout] = {  # keyed by llama.cpp's architecture name (toolkit.models.archs gguf_arch)
    "llama": GgufLayout(permute_qk=True, rope_factors=True, moe_norm_topk=True),  # also Mistral, Mixtral
    "qwen2": GgufLayout(),
    "qwen3": GgufLayout(),
    "qwen2moe": GgufLayout(keys=("expert_ff", "shared_ff"), checks=("every_block_moe",), moe_norm_topk=False),
    "qwen3moe": GgufLayout(keys=("expert_ff",), checks=("every_block_moe",), moe_norm_topk=True),
    "olmoe": GgufLayout(moe_norm_topk=False, checks=("k_norm_full_width",)),
    "phi3": GgufLayout(keys=("phi3_window", "rope_orig_ctx")),
    "phi2": GgufLayout(norm="layer", checks=("no_qk_layernorm",)),
    "gemma": GgufLayout(),
    "gemma2": GgufLayout(keys=("softcapping", "sliding_window"), sliding="pattern", query_scale_27b=46),
    "gemma3": GgufLayout(keys=("softcapping", "sliding_window", "rope_base_swa"), sliding="pattern",
                         query_scale_27b=62, checks=("no_attn_softcapping",)),
    "olmo2": GgufLayout(keys=("sliding_window",), sliding="pattern"),
    "granite": GgufLayout(permute_qk=True, rope_factors=True, keys=("granite_scales",)),
    "command-r": GgufLayout(norm="layer", keys=("logit_scale",), checks=("no_qk_norm",)),
    "starcoder2": GgufLayout(norm="layer"),
    "stablelm": GgufLayout(norm="layer", keys=("parallel_residual",), checks=("no_qk_layernorm",)),
    "smollm3": GgufLayout(permute_qk=True, checks=("nope_every_fourth",)),
    "exaone4": GgufLayout(keys=("sliding_window",), rope_factors=True, checks=("exaone4_window",)),
    "falcon": GgufLayout(norm="layer", qkv="grouped", keys=("falcon_layout",), checks=("falcon_parallel",)),
    "gptneox": GgufLayout(norm="layer", qkv="grouped", keys=("parallel_residual",)),
    "gpt2": GgufLayout(norm="layer", rope=False),
    "bloom": GgufLayout(norm="layer", rope=False, qkv="grouped"),
}
REFUSED: dict[str, str] = {  # llama.cpp names the architecture but cannot run it as a causal LM from this writer
    "gptj": "llama.cpp declares the name 'gptj' but has no loader or graph for it (and its converter none)",
    "bert": "an encoder (llama.cpp serves it for embeddings); this writer writes causal language models",
}


def text_config(config):
    return getattr(config, "text_config", None) or config


def rope_sets(text) -> dict[str, dict]:
    """{"": params} or, for per-layer-type RoPE (Gemma 3), {"full_attention": ..., "sliding_attention": ...}."""
    rope = dict(getattr(text, "rope_parameters", None) or getattr(text, "rope_scaling", None) or {})
    if rope and all(isinstance(v, dict) for v in rope.values()):
        return rope
    return {"": rope}
