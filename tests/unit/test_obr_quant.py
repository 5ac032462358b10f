"""Runtime fake-quant hooks: activations per token and the KV cache, switched on and fully undone."""

import torch

from toolkit.compress.quant import activation_quant, fake_quant_asym, kv_cache_quant
from toolkit.models.adapters import adapter_for, get_layers


def _model():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32)
    return LlamaForCausalLM(config).eval()


def test_hooks_change_the_output_and_are_removed():
    model = _model()
    adapter = adapter_for(model)
    layer = get_layers(model, adapter)[0]
    ids = torch.randint(0, 50, (1, 10), generator=torch.Generator().manual_seed(1))
    paths = [f"model.layers.0.{p}" for p in adapter.block_linears()]
    seen = {}
    with torch.no_grad():
        base = model(ids).logits
        with activation_quant(model, paths, 4), kv_cache_quant(model, [layer.self_attn], 4, 4, hadamard=True):
            handle = layer.self_attn.k_proj.register_forward_pre_hook(  # runs after the quantizing hook
                lambda m, a: seen.__setitem__("k_in", a[0].clone()))
            quantized = model(ids).logits
            levels = seen["k_in"][0, 3].unique().numel()
        after = model(ids).logits
    handle.remove()
    assert levels <= 16  # the k_proj input was quantized to 4 bits per token
    assert not torch.allclose(base, quantized)
    assert torch.equal(base, after) and model.config._attn_implementation != "iclrkit_kvquant"
    assert not hasattr(layer.self_attn, "iclrkit_kv")


def test_asymmetric_kv_quant_error_bound():
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(2))
    step = (x.amax(dim=-1, keepdim=True) - x.amin(dim=-1, keepdim=True)) / 15
    assert ((fake_quant_asym(x, 4) - x).abs() <= step / 2 + 1e-6).all()
