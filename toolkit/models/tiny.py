"""Tiny random-weight models of every architecture the toolkit is tested on, built in-process from transformers'
own configs (`AutoConfig.for_model`; no download): two blocks, hidden 64, four heads (two KV heads where the
architecture has them), MoE models with 4 experts and top-2 routing. The architecture matrix (tests and
`scripts/arch_matrix.py`) runs every command on each; a user can smoke-test a command the same way:

    from toolkit.models.tiny import build_tiny
    build_tiny("mixtral", vocab_size=len(tokenizer)).save_pretrained("tiny-mixtral")
"""

from __future__ import annotations

# model_type → overrides of the shared sizes (attributes the config must carry for these sizes to be valid)
ARCHITECTURES: dict[str, dict] = {
    "llama": {}, "mistral": {}, "qwen2": {}, "qwen3": {"head_dim": 16},
    "qwen2_moe": {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                  "shared_expert_intermediate_size": 64},
    "qwen3_moe": {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "head_dim": 16},
    "mixtral": {"num_local_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 64},
    "olmoe": {"num_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 64},
    "phi3": {}, "phi": {}, "gemma": {"head_dim": 16}, "gemma2": {"head_dim": 16}, "gemma3_text": {"head_dim": 16},
    "gemma3": {}, "olmo2": {}, "granite": {}, "cohere": {}, "starcoder2": {}, "stablelm": {}, "smollm3": {},
    "exaone4": {}, "falcon": {"ffn_hidden_size": 128}, "gpt_neox": {}, "gptj": {"rotary_dim": 8}, "opt": {"ffn_dim": 128},
    "gpt2": {}, "bloom": {},
}
MOE = ("qwen2_moe", "qwen3_moe", "mixtral", "olmoe")

_SIZES = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=128)


def tiny_config(model_type: str, vocab_size: int, layers: int = 2):
    """The config of `build_tiny` (ids 0..2 as pad/bos/eos, inside the vocabulary)."""
    import transformers

    if model_type not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {model_type!r}; known: {', '.join(ARCHITECTURES)}")
    if model_type == "gemma3":
        return _gemma3_conditional(vocab_size, layers)
    config = transformers.AutoConfig.for_model(model_type)
    values = {**_SIZES, "num_hidden_layers": layers, "vocab_size": vocab_size, "pad_token_id": 0,
              "bos_token_id": 1, "eos_token_id": 2, **ARCHITECTURES[model_type]}
    for key, value in values.items():
        if key in ("num_key_value_heads",) and not hasattr(config, key) and key not in config.attribute_map:
            continue
        try:
            setattr(config, key, value)
        except AttributeError:  # derived properties (Falcon's head_dim)
            pass
    if model_type == "opt":
        config.word_embed_proj_dim = config.hidden_size
    if isinstance(getattr(config, "layer_types", None), list):  # derived from the default depth at construction
        config.layer_types = config.layer_types[:layers]
    return config


def build_tiny(model_type: str, vocab_size: int, layers: int = 2):
    """A freshly initialised model (seed torch first for fixed weights), in eval mode."""
    import transformers

    config = tiny_config(model_type, vocab_size, layers)
    if model_type == "gemma3":
        return transformers.Gemma3ForConditionalGeneration(config).eval()
    return transformers.AutoModelForCausalLM.from_config(config).eval()


def _gemma3_conditional(vocab_size: int, layers: int):
    """Gemma3ForConditionalGeneration (its blocks under model.language_model), three extra ids for image tokens."""
    import transformers as tf

    text = tf.Gemma3TextConfig(**{**_SIZES, "num_hidden_layers": layers, "head_dim": 16,
                                  "vocab_size": vocab_size + 3})
    vision = tf.SiglipVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                                   image_size=28, patch_size=14)
    return tf.Gemma3Config(text_config=text.to_dict(), vision_config=vision.to_dict(), mm_tokens_per_image=4,
                           boi_token_index=vocab_size, eoi_token_index=vocab_size + 1,
                           image_token_index=vocab_size + 2)
