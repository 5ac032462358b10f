"""The residual rotation on every architecture of the matrix: where `rotation_refusal` allows it, the rotated float
model gives the unrotated logits (1e-4 relative), with and without the online o_proj rotation; elsewhere the reason
names what breaks exactness. Norm scales are randomised first so the fusion is exercised (fresh norms are all 1)."""

import pytest
import torch

from toolkit.compress.rotation import fold_online_rotations, rotate_model, rotation_refusal
from toolkit.core.errors import BadInputError
from toolkit.models.tiny import ARCHITECTURES, build_tiny
from toolkit.models.view import ModelView

# what the rotation refuses, and why (a fragment of the reason)
REFUSED = {
    "phi": "LayerNorm", "cohere": "LayerNorm", "starcoder2": "LayerNorm", "stablelm": "LayerNorm",
    "falcon": "LayerNorm", "gpt_neox": "LayerNorm", "gptj": "LayerNorm", "opt": "LayerNorm", "gpt2": "LayerNorm",
    "bloom": "final norm",
    "gemma2": "post-norms", "gemma3_text": "post-norms", "gemma3": "post-norms", "olmo2": "post-norms",
    "exaone4": "post-norms",
}


def _model(model_type):
    torch.manual_seed(0)
    model = build_tiny(model_type, 97)
    generator = torch.Generator().manual_seed(1)
    for name, param in model.named_parameters():
        if "norm" in name and param.dim() == 1:
            param.data.copy_(torch.empty(param.shape).uniform_(0.5, 1.5, generator=generator) - (
                1.0 if model_type.startswith("gemma") else 0.0))  # Gemma stores w with scale 1 + w
    return model


@pytest.mark.parametrize("model_type", list(ARCHITECTURES))
def test_rotation_is_exact_or_refused_with_its_reason(model_type):
    model = _model(model_type)
    view = ModelView(model)
    reason = rotation_refusal(view)
    if model_type in REFUSED:
        assert reason is not None and REFUSED[model_type] in reason, reason
        with pytest.raises(BadInputError, match="not exact"):
            rotate_model(view)
        return
    assert reason is None, reason
    ids = torch.randint(3, 97, (2, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        before = model(ids).logits
        record = rotate_model(view, seed=3)
        after = model(ids).logits
        assert (after - before).abs().max() <= 1e-4 * before.abs().max(), model_type
        fold_online_rotations(view)
        assert (model(ids).logits - before).abs().max() <= 1e-4 * before.abs().max()
    assert record["hadamard"]["residual"] in ("exact", "kron-orthogonal")


@pytest.mark.parametrize("model_type", ["llama", "phi3", "qwen3", "gemma"])
def test_rotation_with_the_online_o_proj_rotation_is_exact(model_type):
    model = _model(model_type)
    view = ModelView(model)
    ids = torch.randint(3, 97, (1, 10), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        before = model(ids).logits
        rotate_model(view, seed=1, online_o_proj=True)
        assert (model(ids).logits - before).abs().max() <= 1e-4 * before.abs().max()


def test_moe_refuses_rotation_with_quantized_activations():
    view = ModelView(_model("mixtral"))
    assert "fused experts" in rotation_refusal(view, a_bits=4)
    assert rotation_refusal(view, a_bits=16) is None


def test_fused_qkv_with_grouped_kv_heads_rotates_the_value_rows_only():
    """Phi-3's fused qkv_proj with 4 query heads and 2 KV heads (uneven q and kv widths): the head-wise V rotation
    touches the last 2·head_dim rows only, and the model's function is unchanged."""
    model = _model("phi3")
    view = ModelView(model)
    qkv = view.blocks[0].self_attn.qkv_proj.weight.detach().clone()
    ids = torch.randint(3, 97, (1, 10), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        before = model(ids).logits
        rotate_model(view, seed=2)
        assert (model(ids).logits - before).abs().max() <= 1e-4 * before.abs().max()
    from toolkit.compress.rotation import _value

    slot, rows = _value(view, 0)
    assert slot.name == "self_attn.qkv_proj" and rows == (64 + 32, 64 + 64)
    assert qkv.shape[0] == 128
