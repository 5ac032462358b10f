"""QuaRot-style rotation leaves the float model's function unchanged (logits within 1e-4)."""

import pytest
import torch

from toolkit.compress.orthogonal import OrthogonalRotation, split_power_of_two
from toolkit.compress.rotation import fold_online_rotations, rotate_model
from toolkit.core.errors import BadInputError
from toolkit.models.view import view_of


@pytest.mark.parametrize("n", [8, 12, 48, 576])
def test_rotation_is_orthogonal_and_apply_matches_the_matrix(n):
    rotation = OrthogonalRotation(n, seed=3)
    Q = rotation.matrix()
    assert torch.allclose(Q @ Q.t(), torch.eye(n, dtype=torch.float64), atol=1e-10)
    x = torch.randn(2, 3, n, dtype=torch.float64)
    assert torch.allclose(rotation.apply(x), x @ Q, atol=1e-10)
    p, m = split_power_of_two(n)
    assert p * m == n and m % 2 == 1


def _llama(hidden, intermediate, tie=True):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=97, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=2,
                         num_attention_heads=hidden // 16, num_key_value_heads=hidden // 32,
                         max_position_embeddings=64, tie_word_embeddings=tie)
    model = LlamaForCausalLM(config).eval()
    for name, param in model.named_parameters():
        if "norm" in name:  # non-trivial γ so the norm fusion is exercised
            param.data.uniform_(0.5, 1.5)
    return model


@pytest.mark.parametrize("hidden,intermediate,tie", [(64, 128, True), (96, 168, False)])
def test_rotated_model_gives_the_same_logits(hidden, intermediate, tie):
    model = _llama(hidden, intermediate, tie)
    ids = torch.randint(0, 97, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        before = model(ids).logits
        rotate_model(view_of(model), seed=5)
        after = model(ids).logits
        assert (after - before).abs().max() < 1e-4
        assert not torch.allclose(model.model.layers[0].mlp.up_proj.weight, _llama(hidden, intermediate, tie)
                                  .model.layers[0].mlp.up_proj.weight)
        fold_online_rotations(view_of(model))
        assert (model(ids).logits - before).abs().max() < 1e-4


def test_layernorm_models_refuse_rotation(tiny_gpt2_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_gpt2_dir)
    with pytest.raises(BadInputError, match="LayerNorm"):
        rotate_model(view_of(model))


def test_rotation_builds_on_the_weights_device():
    """Q, the rotated weights and the online hook live on the weights' device: on the meta device any CPU-built
    factor meeting a meta weight would raise (as a CPU Q against CUDA weights did)."""
    with torch.device("meta"):
        model = _llama(64, 96, tie=False)
    rotate_model(view_of(model), seed=5)
    assert all(p.device.type == "meta" for p in model.parameters())
    down = model.model.layers[0].mlp.down_proj
    x = torch.empty(2, 3, 96, device="meta", dtype=torch.bfloat16)
    y = down.iclrkit_online_rotation.apply(x)
    assert y.device.type == "meta" and y.dtype == torch.bfloat16 and y.shape == x.shape
    with torch.no_grad():
        logits = model(torch.zeros(1, 4, dtype=torch.long, device="meta")).logits
    assert logits.device.type == "meta" and logits.shape == (1, 4, 97)
    fold_online_rotations(view_of(model))
    assert down.weight.device.type == "meta"


def test_online_rotation_runs_in_the_activation_dtype():
    rotation = OrthogonalRotation(48, seed=2)
    x = torch.randn(3, 48, dtype=torch.float64)
    for dtype in (torch.float32, torch.bfloat16):
        y = rotation.apply(x.to(dtype))
        assert y.dtype == dtype
        assert torch.allclose(y.double(), x @ rotation.matrix(), atol=0.05 if dtype == torch.bfloat16 else 1e-5)
    assert {key[1] for key in rotation._cache} >= {torch.float32, torch.bfloat16}
    assert rotation.matrix("meta").device.type == "meta"


def _llama_heads(hidden, intermediate, heads, kv_heads):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=97, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=2,
                         num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=64,
                         tie_word_embeddings=False)
    model = LlamaForCausalLM(config).eval()
    for name, param in model.named_parameters():
        if "norm" in name:
            param.data.uniform_(0.5, 1.5)
    return model


@pytest.mark.parametrize("heads,o_kind", [(12, "exact"), (6, "kron-orthogonal")])
@pytest.mark.parametrize("online_o_proj", [False, True])
def test_exact_hadamard_rotation_on_a_12x2k_llama_keeps_logits(heads, o_kind, online_o_proj):
    """hidden 96 = 12·8, intermediate 384 = 12·32: every rotation an exact (Paley × Sylvester) Hadamard; with
    online_o_proj the cross-head Hadamard before o_proj (exact over 12 heads, kron-orthogonal over 6) is fused into
    o_proj's weight, and the rotated model with its hooks gives the original logits."""
    from toolkit.ops.hadamard import exact_hadamard

    model = _llama_heads(96, 384, heads, heads // 2)
    ids = torch.randint(0, 97, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        before = model(ids).logits
        record = rotate_model(view_of(model), seed=5, online_o_proj=online_o_proj)
        after = model(ids).logits
        assert (after - before).abs().max() < 1e-4
        expected = {"residual": "exact", "head": "exact", "down_proj": "exact"}
        if online_o_proj:
            expected["o_proj"] = o_kind
        assert record["hadamard"] == expected
        assert bool(record.get("online_o_proj")) == online_o_proj
        layer = model.model.layers[0]
        down = layer.mlp.down_proj.iclrkit_online_rotation
        x = torch.randn(3, 384, dtype=torch.float64)
        torch.testing.assert_close(down.apply(x), x @ exact_hadamard(384) / 384 ** 0.5, rtol=0, atol=1e-10)
        assert hasattr(layer.self_attn.o_proj, "iclrkit_online_rotation") == online_o_proj
        fold_online_rotations(view_of(model))
        assert not hasattr(layer.self_attn.o_proj, "iclrkit_online_rotation")
        assert not layer.self_attn.o_proj._forward_pre_hooks and not layer.mlp.down_proj._forward_pre_hooks
        assert (model(ids).logits - before).abs().max() < 1e-4


def test_online_rotations_rebuild_from_the_record():
    """A packed file's record rebuilds the very rotations rotate_model installed; a record without "hadamard"
    (written before exact Hadamards) rebuilds the kron-orthogonal down_proj rotation it was made with."""
    from toolkit.compress.rotation import online_rotations

    model = _llama_heads(96, 384, 12, 4)
    record = rotate_model(view_of(model), seed=2, online_o_proj=True)
    down, cross = online_rotations(record)
    layer = model.model.layers[1]
    assert torch.equal(down.matrix(), layer.mlp.down_proj.iclrkit_online_rotation.matrix())
    assert torch.equal(cross.matrix(), layer.self_attn.o_proj.iclrkit_online_rotation.matrix())
    legacy = {k: v for k, v in record.items() if k not in ("hadamard", "online_o_proj")}
    old_down, old_cross = online_rotations(legacy)
    assert old_down.kind == "kron-orthogonal" and old_cross is None
    assert torch.equal(old_down.matrix(), OrthogonalRotation(384, 4, "kron-orthogonal").matrix())


@pytest.mark.parametrize("kind", ["kron-orthogonal", "exact", "auto"])
def test_rotation_kind_is_applied_recorded_and_function_preserving(kind):
    """rotation_kind picks every rotation's construction; the record names it, and the packed loader's rebuild of
    the online rotation (`online_rotations`) gives the same matrix. 96 = 32·3 and 192 = 64·3: exact Hadamards
    exist (order 12 via Paley), so "exact" and "auto" agree and "kron-orthogonal" differs."""
    from toolkit.compress.rotation import online_rotations

    model = _llama(96, 192, tie=False)
    ids = torch.randint(0, 97, (2, 16), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        before = model(ids).logits
        record = rotate_model(view_of(model), seed=4, kind=kind)
        assert (model(ids).logits - before).abs().max() < 1e-4
    expected = "kron-orthogonal" if kind == "kron-orthogonal" else "exact"
    assert set(record["hadamard"].values()) == {expected}
    down, _ = online_rotations(record)
    hooked = model.model.layers[0].mlp.down_proj.iclrkit_online_rotation
    assert torch.equal(down.matrix(), hooked.matrix())


def test_rotation_kind_exact_refuses_widths_without_a_construction():
    with pytest.raises(BadInputError, match="no exact Hadamard"):
        OrthogonalRotation(2 * 23 * 23, seed=0, kind="exact")


def test_rotation_kind_is_a_config_key():
    from toolkit.compress.config import CompressConfig

    assert CompressConfig(model="m", method="gptq", rotation_kind="kron-orthogonal").rotation_kind == "kron-orthogonal"
    with pytest.raises(Exception):
        CompressConfig(model="m", method="gptq", rotation_kind="random")


def test_factored_rotation_equals_the_dense_product():
    """rotate_model applies each rotation by its factors (matmul over m, Walsh–Hadamard over p); the weights equal the
    dense products W·diag(γ)·Q (q), Q_hᵀ·W·diag(γ)·Q (v: per head on its outputs) and Qᵀ·W·Q_int (down_proj) to float32 rounding."""
    model = _llama(96, 192, tie=False)
    layer = model.model.layers[0]
    q0 = layer.self_attn.q_proj.weight.detach().double().clone()
    gamma = layer.input_layernorm.weight.detach().double().clone()
    v0 = layer.self_attn.v_proj.weight.detach().double().clone()
    down0 = layer.mlp.down_proj.weight.detach().double().clone()
    record = rotate_model(view_of(model), seed=6)
    Q = OrthogonalRotation(96, 6).matrix()
    head_dim = 96 // model.config.num_attention_heads
    Qh = OrthogonalRotation(head_dim, 7).matrix()
    Qint = OrthogonalRotation(192, 8, signs=False).matrix()
    expect_q = (q0 * gamma.unsqueeze(0)) @ Q
    expect_v = torch.block_diag(*[Qh] * (v0.shape[0] // head_dim)).t() @ (v0 * gamma.unsqueeze(0)) @ Q
    expect_down = Q.t() @ down0 @ Qint
    for got, expect in ((layer.self_attn.q_proj.weight, expect_q), (layer.self_attn.v_proj.weight, expect_v),
                        (layer.mlp.down_proj.weight, expect_down)):
        assert torch.allclose(got.double(), expect, rtol=0, atol=1e-6 * expect.abs().max().item())
    assert record["hadamard"]["residual"] == "exact"
