import pytest
import torch

from toolkit.core.errors import BadInputError, ResourceError
from toolkit.models.adapters import adapter_for, get_layers, get_lm_head, get_module, linear_weight
from toolkit.models.save import read_metadata, save_model
from toolkit.models.source import load_model, resolve_model_path


def _tiny_models():
    import transformers as tf

    common = dict(vocab_size=64)
    yield tf.GPT2LMHeadModel(tf.GPT2Config(n_positions=32, n_embd=16, n_layer=2, n_head=2, **common))
    yield tf.LlamaForCausalLM(tf.LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                             num_attention_heads=2, num_key_value_heads=1, **common))
    yield tf.MistralForCausalLM(tf.MistralConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                                 num_attention_heads=2, num_key_value_heads=1, **common))
    yield tf.Qwen2ForCausalLM(tf.Qwen2Config(hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                             num_attention_heads=2, num_key_value_heads=1, **common))
    yield tf.OPTForCausalLM(tf.OPTConfig(hidden_size=16, ffn_dim=32, num_hidden_layers=2, num_attention_heads=2,
                                         word_embed_proj_dim=16, max_position_embeddings=32, **common))
    yield tf.GPTNeoXForCausalLM(tf.GPTNeoXConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                                 num_attention_heads=2, **common))
    yield tf.Gemma3ForCausalLM(tf.Gemma3TextConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                                   num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                                                   **common))
    yield tf.BertForSequenceClassification(tf.BertConfig(hidden_size=16, intermediate_size=32,
                                                         num_hidden_layers=2, num_attention_heads=2, **common))


@pytest.mark.parametrize("model", list(_tiny_models()), ids=lambda m: m.config.model_type)
def test_adapter_paths_resolve_for_every_architecture(model):
    adapter = adapter_for(model)
    layers = get_layers(model, adapter)
    assert len(layers) == 2
    for path in adapter.block_linears() + [adapter.norm_attn, adapter.norm_mlp, *adapter.extra_norms]:
        get_module(layers[0], path)
    for linear_path in adapter.block_linears():
        weight = linear_weight(get_module(layers[0], linear_path), adapter.conv1d)
        assert weight.ndim == 2
    if adapter.causal:
        assert get_lm_head(model, adapter) is not None


def test_unknown_architecture_is_bad_input():
    class Fake(torch.nn.Module):
        config = type("C", (), {"model_type": "mamba"})()

    with pytest.raises(BadInputError, match="no architecture adapter for model_type 'mamba'"):
        adapter_for(Fake())


def test_save_reload_round_trip_gives_equal_logits(tiny_llama_dir, tmp_path):
    model, tokenizer = load_model(str(tiny_llama_dir))
    out = save_model(model, tokenizer, tmp_path / "saved", technique="test", source=str(tiny_llama_dir),
                     metadata={"note": "round trip"})
    reloaded, _ = load_model(str(out))
    ids = torch.randint(0, 100, (2, 12))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, reloaded(ids).logits)
    assert (out / "README.md").exists() and (out / "generation_config.json").exists()
    assert list(out.glob("*.safetensors")) and read_metadata(out) == {"note": "round trip"}


def test_missing_sources_fail_with_the_right_code(tmp_path, monkeypatch):
    with pytest.raises(BadInputError, match="model path not found"):
        resolve_model_path(str(tmp_path / "nope"))
    with pytest.raises(BadInputError, match="unknown zoo model"):
        resolve_model_path("zoo:no-such-model")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ResourceError, match="not cached"):
        resolve_model_path("some-org/some-uncached-model")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(BadInputError, match="no config.json"):
        resolve_model_path(str(empty))


def test_zoo_variants_never_shadow_the_default(tmp_path):
    from toolkit.zoo.registry import variant_key

    data = tmp_path / "d.txt"
    data.write_text("some text")
    assert variant_key(None) == "" and variant_key("embedded") == ""
    assert variant_key(None, steps=100) == "embedded-s100"
    assert len(variant_key(str(data))) == 8
    assert variant_key(str(data), layers=2).endswith("-l2") and variant_key(str(data), layers=2) != variant_key(str(data))
