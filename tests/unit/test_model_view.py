"""ModelView: one bound view of the architecture (resolved block list, full linear paths, (out, in) weights) for
every supported family, Gemma3ForConditionalGeneration (blocks under model.language_model) included."""

import pytest
import torch

from toolkit.core.errors import BadInputError
from toolkit.models.adapters import ModelView, adapter_for, get_layers, layers_path


def _configs():
    import transformers as tf

    kv = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
              num_key_value_heads=1, vocab_size=64)
    yield "gpt2", lambda: tf.GPT2LMHeadModel(tf.GPT2Config(n_positions=32, n_embd=16, n_layer=2, n_head=2,
                                                           vocab_size=64))
    yield "llama", lambda: tf.LlamaForCausalLM(tf.LlamaConfig(**kv))
    yield "mistral", lambda: tf.MistralForCausalLM(tf.MistralConfig(**kv))
    yield "qwen2", lambda: tf.Qwen2ForCausalLM(tf.Qwen2Config(**kv))
    yield "qwen3", lambda: tf.Qwen3ForCausalLM(tf.Qwen3Config(head_dim=8, **kv))
    yield "opt", lambda: tf.OPTForCausalLM(tf.OPTConfig(hidden_size=16, ffn_dim=32, num_hidden_layers=2,
                                                        num_attention_heads=2, word_embed_proj_dim=16,
                                                        max_position_embeddings=32, vocab_size=64))
    yield "gpt_neox", lambda: tf.GPTNeoXForCausalLM(tf.GPTNeoXConfig(hidden_size=16, intermediate_size=32,
                                                                     num_hidden_layers=2, num_attention_heads=2,
                                                                     vocab_size=64))
    yield "gemma3_text", lambda: tf.Gemma3ForCausalLM(tf.Gemma3TextConfig(head_dim=8, **kv))
    yield "gemma3", gemma3_conditional


def gemma3_conditional():
    import transformers as tf

    text = tf.Gemma3TextConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                               num_key_value_heads=1, head_dim=8, vocab_size=300)
    vision = tf.SiglipVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                   num_attention_heads=2, image_size=28, patch_size=14)
    config = tf.Gemma3Config(text_config=text.to_dict(), vision_config=vision.to_dict(), mm_tokens_per_image=4,
                             image_token_index=299, boi_token_index=297, eoi_token_index=298)
    return tf.Gemma3ForConditionalGeneration(config)


CONFIGS = list(_configs())


@pytest.mark.parametrize("name,build", CONFIGS, ids=[n for n, _ in CONFIGS])
def test_view_resolves_blocks_and_every_linear(name, build):
    torch.manual_seed(0)
    model = build()
    view = ModelView(model)
    assert view.layers_path == layers_path(model)
    assert view.blocks is get_layers(model) and len(view) == 2
    paths = view.block_linear_paths()
    assert len(paths) == 2 * len(view.adapter.block_linears())
    for path in paths:
        assert path.startswith(view.layers_path + ".")
        weight = view.weight(path)
        module = model.get_submodule(path)  # the full path names a real module of the model itself
        assert weight.ndim == 2 and weight.numel() == module.weight.numel()
    # (out, in) write-back through the view, Conv1D transposition included
    path = paths[0]
    new = torch.randn_like(view.weight(path))
    view.set_weight(path, new)
    torch.testing.assert_close(view.weight(path), new)
    assert view.embed_tokens is not None and view.lm_head is not None
    assert view.attention(0) is view.blocks[0].get_submodule(view.adapter.attn_out.rsplit(".", 1)[0])


def test_gemma3_conditional_blocks_live_under_the_language_model():
    view = ModelView(gemma3_conditional())
    assert view.layers_path == "model.language_model.layers"
    assert adapter_for(view.model).layers[0] != view.layers_path  # the bug the view exists for


def test_no_block_list_is_bad_input():
    model = torch.nn.Module()
    model.config = type("C", (), {"model_type": "llama"})()
    with pytest.raises(BadInputError, match="none of the block lists"):
        ModelView(model)
