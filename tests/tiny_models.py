"""Tiny random-weight decoders of every family the architecture adapters support, built in-process (no downloads).

    from tiny_models import FAMILIES, build_family
    model = build_family("gemma3", vocab_size=len(tokenizer))

`FAMILIES` lists the names: GPT-2 (Conv1D), Llama, Mistral, Qwen2, Qwen3, OPT, GPT-NeoX, Gemma3 text, and
Gemma3ForConditionalGeneration ("gemma3": its blocks live under model.language_model). Two blocks, width 32.
"""

from __future__ import annotations

FAMILIES = ("gpt2", "llama", "mistral", "qwen2", "qwen3", "opt", "gpt_neox", "gemma3_text", "gemma3")


def build_family(name: str, vocab_size: int, hidden: int = 32, layers: int = 2):
    """A freshly initialised model of family `name` (seed it first for fixed weights), in eval mode."""
    import transformers as tf

    kv = dict(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=vocab_size, max_position_embeddings=128)
    head_dim = hidden // 4
    if name == "gpt2":
        model = tf.GPT2LMHeadModel(tf.GPT2Config(n_positions=128, n_embd=hidden, n_layer=layers, n_head=4,
                                                 vocab_size=vocab_size))
    elif name in ("llama", "mistral", "qwen2"):
        config_cls, model_cls = {"llama": (tf.LlamaConfig, tf.LlamaForCausalLM),
                                 "mistral": (tf.MistralConfig, tf.MistralForCausalLM),
                                 "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM)}[name]
        model = model_cls(config_cls(**kv))
    elif name == "qwen3":
        model = tf.Qwen3ForCausalLM(tf.Qwen3Config(head_dim=head_dim, **kv))
    elif name == "opt":
        model = tf.OPTForCausalLM(tf.OPTConfig(hidden_size=hidden, ffn_dim=2 * hidden, num_hidden_layers=layers,
                                               num_attention_heads=4, word_embed_proj_dim=hidden,
                                               max_position_embeddings=128, vocab_size=vocab_size))
    elif name == "gpt_neox":
        model = tf.GPTNeoXForCausalLM(tf.GPTNeoXConfig(hidden_size=hidden, intermediate_size=2 * hidden,
                                                       num_hidden_layers=layers, num_attention_heads=4,
                                                       vocab_size=vocab_size))
    elif name == "gemma3_text":
        model = tf.Gemma3ForCausalLM(tf.Gemma3TextConfig(head_dim=head_dim, **kv))
    elif name == "gemma3":  # three extra ids for the image tokens
        text = tf.Gemma3TextConfig(head_dim=head_dim, **{**kv, "vocab_size": vocab_size + 3})
        vision = tf.SiglipVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                       num_attention_heads=2, image_size=28, patch_size=14)
        model = tf.Gemma3ForConditionalGeneration(tf.Gemma3Config(
            text_config=text.to_dict(), vision_config=vision.to_dict(), mm_tokens_per_image=4,
            boi_token_index=vocab_size, eoi_token_index=vocab_size + 1, image_token_index=vocab_size + 2))
    else:
        raise ValueError(f"unknown family {name!r}; known: {', '.join(FAMILIES)}")
    return model.eval()
