"""Runtime fake-quant hooks: activations per token and the KV cache, switched on and fully undone."""

import pytest
import torch

from toolkit.compress.quant import (
    activation_quant,
    fake_quant_asym,
    fake_quant_kv,
    kv_cache_quant,
    kv_quant_params,
)
from toolkit.models.view import view_of


def _model():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32)
    return LlamaForCausalLM(config).eval()


def test_hooks_change_the_output_and_are_removed():
    model = _model()
    view = view_of(model)
    layer = view.blocks[0]
    ids = torch.randint(0, 50, (1, 10), generator=torch.Generator().manual_seed(1))
    paths = view.quantized_inputs()
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


def test_token_symmetric_kv_scale_layout_and_values():
    """QuaRot's KV4 (k_groupsize = v_groupsize = -1, symmetric): one scale per (batch, token) over every KV head and
    head_dim entry, scale = max|x| / 7 at 4 bits, codes in ±7; checked against a loop written from that rule."""
    batch, heads, seq, head_dim, bits = 2, 3, 5, 4, 4
    x = torch.randn(batch, heads, seq, head_dim, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    x[1, :, 2] = 0  # an all-zero token: scale 1, stays 0
    scale, zero = kv_quant_params(x, bits, "token-sym")
    assert zero is None and scale.shape == (batch, 1, seq, 1)
    expected = torch.empty(batch, 1, seq, 1, dtype=torch.float64)
    quantized = torch.empty_like(x)
    for b in range(batch):
        for t in range(seq):
            row = [float(x[b, h, t, d]) for h in range(heads) for d in range(head_dim)]
            s = max(abs(v) for v in row) / 7 or 1.0
            expected[b, 0, t, 0] = s
            for h in range(heads):
                for d in range(head_dim):
                    quantized[b, h, t, d] = min(7, max(-7, round(float(x[b, h, t, d]) / s))) * s
    torch.testing.assert_close(scale, expected, rtol=0, atol=0)
    torch.testing.assert_close(fake_quant_kv(x, bits, "token-sym"), quantized, rtol=0, atol=1e-12)
    assert fake_quant_kv(x, bits)[1, :, 2].abs().sum() == 0  # token-sym is the default
    assert torch.equal(fake_quant_kv(x, 16, "token-sym"), x)


def test_head_asymmetric_kv_is_the_previous_quantizer():
    x = torch.randn(2, 3, 5, 8, generator=torch.Generator().manual_seed(4))
    scale, zero = kv_quant_params(x, 4, "head-asym")
    assert scale.shape == zero.shape == (2, 3, 5, 1)
    torch.testing.assert_close(scale, ((x.amax(-1, keepdim=True) - x.amin(-1, keepdim=True)) / 15).clamp(min=1e-8))
    assert torch.equal(fake_quant_kv(x, 4, "head-asym"), fake_quant_asym(x, 4))
    with pytest.raises(Exception, match="unknown KV quantizer"):
        fake_quant_kv(x, 4, "per-channel")


@pytest.mark.parametrize("mode", ["token-sym", "head-asym"])
def test_kv_cache_quant_uses_the_chosen_quantizer(mode):
    """Inside attention K and V are quantized with the chosen scheme: recomputing attention's inputs through a spy
    inner attention shows each token's K over all heads on one symmetric grid (token-sym) or not (head-asym)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, AttentionInterface

    model = _model()
    layer = view_of(model).blocks[0]
    seen = {}

    def spy(module, query, key, value, attention_mask, **kwargs):
        seen["key"] = key.clone()
        return ALL_ATTENTION_FUNCTIONS["sdpa"](module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register("spy_sdpa", spy)
    model.config._attn_implementation = "spy_sdpa"
    ids = torch.randint(0, 50, (1, 10), generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), kv_cache_quant(model, [layer.self_attn], 4, 4, hadamard=False, mode=mode):
        model(ids)
    key = seen["key"]  # [1, kv_heads=1, 10, 16]
    scale, _ = kv_quant_params(key, 4, "token-sym")
    on_grid = torch.allclose(torch.round(key / scale) * scale, key, atol=1e-6)
    assert on_grid == (mode == "token-sym")
