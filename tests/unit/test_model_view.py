"""ModelView discovery on every architecture of the matrix (toolkit.models.tiny): the block list, every slot (Linear,
Conv1D, each expert of a fused expert tensor) exactly once in a group, groups in the order their inputs arrive with
the norm each reads, roles, and (out, in) weights written back through the slot whatever the storage."""

import pytest
import torch

from toolkit.core.errors import BadInputError
from toolkit.models.layout import structural_slots
from toolkit.models.tiny import ARCHITECTURES, MOE, build_tiny
from toolkit.models.view import ModelView, view_of

VOCAB = 97


@pytest.fixture(scope="module")
def models():
    cache = {}

    def get(model_type):
        if model_type not in cache:
            torch.manual_seed(0)
            cache[model_type] = build_tiny(model_type, VOCAB)
        return cache[model_type]
    return get


@pytest.mark.parametrize("model_type", list(ARCHITECTURES))
def test_every_slot_is_in_exactly_one_group(models, model_type):
    model = models(model_type)
    view = ModelView(model)
    assert len(view) == 2
    assert view.blocks is model.get_submodule(view.layers_path)
    layout = view.layout(0)
    slots, routers, _ = structural_slots(view.blocks[0])
    names = [s.name for g in layout.groups for s in g.slots]
    assert sorted(names) == sorted(s.name for s in slots) and len(names) == len(set(names))
    assert layout.attention is not None
    assert any("attn_in" in g.roles for g in layout.groups) and any("attn_out" in g.roles for g in layout.groups)
    assert any(g.roles & {"mlp_out", "experts_out"} for g in layout.groups)
    # the first group reads the block's first norm; every slot's weight is (out, in) of its parameter's shape
    assert layout.groups[0].norm is not None or model_type in ("olmo2", "exaone4")  # post-norm: no norm in front
    block = view.blocks[0]
    for slot in layout.slots:
        assert tuple(slot.weight(block).shape) == slot.shape(block)
    assert view.embed_tokens is not None and view.lm_head is not None and view.final_norm is not None or \
        model_type == "bloom"


@pytest.mark.parametrize("model_type", ["llama", "gpt2", "phi3", "mixtral"])
def test_weights_write_back_through_the_slot(models, model_type):
    view = ModelView(models(model_type))
    block = view.blocks[1]
    for slot in (view.slots(1)[0], view.slots(1)[-1]):
        name = view.full_name(1, slot)
        new = torch.randn(slot.shape(block), generator=torch.Generator().manual_seed(1))
        view.set_weight(name, new)
        assert torch.equal(view.weight(name), new)
        assert torch.equal(slot.weight(block), new)
    if model_type == "gpt2":  # Conv1D stores (in, out): the view transposes
        slot = view.slots(1)[0]
        assert torch.equal(block.get_submodule(slot.module).weight.data.t(), view.weight(view.full_name(1, slot)))
    if model_type == "mixtral":  # one expert's slice, the others untouched
        slot = view.slots(1)[-1]
        assert slot.kind == "expert" and slot.expert == 3
        tensor = block.get_submodule(slot.module).down_proj.data
        assert torch.equal(tensor[3], view.weight(view.full_name(1, slot)))


def test_llama_groups_in_call_order_with_their_norms(models):
    layout = ModelView(models("llama")).layout(0)
    assert [g.names for g in layout.groups] == [
        ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"], ["self_attn.o_proj"],
        ["mlp.gate_proj", "mlp.up_proj"], ["mlp.down_proj"]]
    assert [g.norm for g in layout.groups] == ["input_layernorm", None, "post_attention_layernorm", None]
    assert [g.role for g in layout.groups] == ["attn_in", "attn_out", "mlp_in", "mlp_out"]
    assert not layout.parallel and not layout.post_norms


@pytest.mark.parametrize("model_type", ["phi", "gptj", "falcon", "cohere"])
def test_parallel_blocks_share_one_input_group(models, model_type):
    layout = ModelView(models(model_type)).layout(0)
    assert layout.parallel
    first = layout.groups[0]
    assert first.roles == {"attn_in", "mlp_in"} and first.norm is not None
    assert [g.role for g in layout.groups[1:]] == ["attn_out", "mlp_out"]


def test_gpt_neox_two_norms_of_one_input_are_two_groups(models):
    """GPT-NeoX's parallel residual reads the same x through two LayerNorms: freshly initialised, their outputs are
    equal in value, but they are two inputs (grouping is by tensor identity, not by value)."""
    layout = ModelView(models("gpt_neox")).layout(0)
    assert [g.norm for g in layout.groups] == ["input_layernorm", None, "post_attention_layernorm", None]


@pytest.mark.parametrize("model_type", ["gemma", "gemma2", "gemma3_text"])
def test_gemma_norms_are_measured_one_plus_w(models, model_type):
    layout = ModelView(models(model_type)).layout(0)
    assert all(n.kind == "rmsnorm" and n.offset == 1.0 for n in layout.norms.values())
    if model_type != "gemma":
        assert layout.post_norms == ["post_attention_layernorm", "post_feedforward_layernorm"]


def test_layernorm_kind_is_measured(models):
    layout = ModelView(models("gpt2")).layout(0)
    assert {n.kind for n in layout.norms.values()} == {"layernorm"}
    assert ModelView(models("qwen3")).layout(0).qk_norms == ["self_attn.q_norm", "self_attn.k_norm"]


@pytest.mark.parametrize("model_type", MOE)
def test_experts_one_slot_per_expert_and_routers_apart(models, model_type):
    view = ModelView(models(model_type))
    layout = view.layout(0)
    experts = [g for g in layout.groups if g.experts]
    assert [g.role for g in experts] == ["experts_in", "experts_out"]
    assert [s.expert for s in experts[0].slots] == [0, 1, 2, 3] and experts[0].norm == "post_attention_layernorm"
    assert "mlp.gate" in [r.name for r in layout.routers]
    assert view.dims()["experts"] == 4
    if model_type == "qwen2_moe":  # the shared expert is a plain MLP; its gate is a router
        assert "mlp.shared_expert_gate" in [r.name for r in layout.routers]
        assert view.mlp_out(0).name == "mlp.shared_expert.down_proj"
    else:
        with pytest.raises(BadInputError, match="mixture of experts"):
            view.mlp_out(0)


def test_gemma3_conditional_blocks_live_under_the_language_model(models):
    view = ModelView(models("gemma3"))
    assert view.layers_path == "model.language_model.layers"
    assert view.final_norm_path == "model.language_model.norm"


def test_view_is_resolved_once_per_model(models):
    model = models("llama")
    assert view_of(model) is view_of(model)


def test_no_block_list_is_one_line_of_bad_input():
    model = torch.nn.Sequential(torch.nn.Linear(3, 3))
    with pytest.raises(BadInputError, match="no decoder block list found"):
        ModelView(model)


def test_unknown_three_d_parameter_layout_is_refused():
    class Odd(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.experts_w = torch.nn.Parameter(torch.zeros(4, 8, 8))
            self.proj = torch.nn.Linear(8, 8)

    block = torch.nn.Module()
    block.mlp = Odd()
    with pytest.raises(BadInputError, match="mlp holds 3-D parameters"):
        structural_slots(block)
