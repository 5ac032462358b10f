"""compressed-tensors pack-quantized export: the packing matches an independent bit-stream reference, and
`AutoModelForCausalLM.from_pretrained(out)` (with compressed-tensors installed) reproduces the in-memory fake-quant
model's logits, rotated and unrotated, per channel and grouped, with sparsity stored as zero codes."""

import json

import pytest
import torch

from toolkit.compress.quant import fit_weight_scale, quantize_rows
from toolkit.core.errors import BadInputError
from toolkit.export.compressed_tensors import check_exportable, pack_int32, unpack_int32
from toolkit.export.quantized import from_model
from toolkit.models.view import view_of

pytestmark = pytest.mark.usefixtures("one_thread")
CT_REASON = "compressed-tensors is not installed (pip install compressed-tensors)"


def _reference_pack(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Element i of a row → bits i·b … i·b+b−1 of the row's little-endian bit stream, as Python integers."""
    rows, cols = codes.shape
    words = -(-cols * bits // 32)
    out = torch.zeros(rows, words, dtype=torch.int64)
    for r in range(rows):
        stream = 0
        for i, c in enumerate(codes[r].tolist()):
            stream |= (c + (1 << (bits - 1))) << (i * bits)
        for w in range(words):
            out[r, w] = (stream >> (32 * w)) & 0xFFFFFFFF
    return torch.where(out >= 2**31, out - 2**32, out).to(torch.int32)


@pytest.mark.parametrize("bits,cols", [(4, 45), (4, 64), (3, 37), (8, 33), (2, 70)])
def test_packing_matches_bit_stream_reference(bits, cols):
    gen = torch.Generator().manual_seed(bits * cols)
    codes = torch.randint(-(1 << (bits - 1)), 1 << (bits - 1), (3, cols), generator=gen).to(torch.int8)
    packed = pack_int32(codes, bits)
    assert torch.equal(packed, _reference_pack(codes, bits))
    assert torch.equal(unpack_int32(packed, bits, cols), codes)


def test_packing_matches_the_library_when_installed():
    helpers = pytest.importorskip("compressed_tensors.compressors.pack_quantized.helpers", reason=CT_REASON)
    codes = torch.randint(-8, 8, (5, 45), generator=torch.Generator().manual_seed(0)).to(torch.int8)
    assert torch.equal(pack_int32(codes, 4), helpers.pack_to_int32(codes, 4))


def _tiny_llama(tie: bool):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         tie_word_embeddings=tie)
    return LlamaForCausalLM(config).eval()


def _fake_quant(view, group: int | None, sparsity: float = 0.5, bits: int = 4) -> dict:
    """RTN with a magnitude mask: weights set to codes × scale in place; returns the scales per linear."""
    scales = {}
    for i, block in enumerate(view.blocks):
        for slot in view.slots(i):
            W = slot.weight(block)
            keep = W.abs() > W.abs().quantile(sparsity, dim=1, keepdim=True)
            if group is None:
                scale = fit_weight_scale(W, bits)
                new = quantize_rows(W * keep, scale, bits)
            else:
                rows, cols = W.shape
                scale = fit_weight_scale((W * keep).reshape(-1, group), bits).reshape(rows, cols // group)
                entry = scale.repeat_interleave(group, dim=1)
                new = quantize_rows(W * keep, entry, bits)
            slot.set_weight(block, new)
            scales[view.full_name(i, slot)] = scale
    return scales


def _metadata(rotation=None, group=None, a_bits=16, kv_bits=16):
    return {"method": "rtn", "w_bits": 4, "a_bits": a_bits, "kv_bits": kv_bits, "sparsity": 0.5,
            "rotation": rotation, "group_size": group}


def _relative(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out - ref).abs().max() / ref.abs().max())


@pytest.mark.parametrize("rotate,group", [(False, None), (True, None), (False, 32), (True, 32)])
def test_reload_reproduces_in_memory_logits(tmp_path, rotate, group):
    pytest.importorskip("compressed_tensors", reason=CT_REASON)
    from transformers import AutoModelForCausalLM

    from toolkit.export.compressed_tensors import save_compressed_tensors

    model = _tiny_llama(tie=not rotate)
    view = view_of(model)
    rotation = None
    if rotate:
        from toolkit.compress.rotation import rotate_model

        rotation = rotate_model(view, seed=3)
    scales = _fake_quant(view, group)
    q = from_model(view, None, scales, 4, _metadata(rotation, group), {"source_model": "tiny"})
    summary = save_compressed_tensors(q, tmp_path / "ct", {"command": "pytest"})
    config = json.loads((tmp_path / "ct" / "config.json").read_text())["quantization_config"]
    assert config["format"] == "pack-quantized" and config["quant_method"] == "compressed-tensors"
    weights = config["config_groups"]["group_0"]["weights"]
    assert weights["strategy"] == ("group" if group else "channel") and weights["group_size"] == group
    down = [f"model.layers.{i}.mlp.down_proj" for i in range(2)]
    assert set(down) <= set(config["ignore"]) if rotate else config["ignore"] == ["lm_head"]
    assert summary["folded_down_proj"] == (2 if rotate else 0)

    from compressed_tensors.quantization import QuantizationConfig

    QuantizationConfig.model_validate({k: v for k, v in config.items()
                                       if k not in ("version", "sparsity_config", "transform_config")})
    ids = torch.randint(0, 300, (2, 16), generator=torch.Generator().manual_seed(1))
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "ct").eval()
    with torch.no_grad():
        reference, out = model(ids).logits, reloaded(ids).logits
    assert _relative(out, reference) <= 1e-5
    # the stored tensors are what was read: q_proj's zeros (pruned weights) survive the reload exactly
    q_proj = reloaded.model.layers[0].self_attn.q_proj.weight
    assert torch.equal(q_proj == 0, model.model.layers[0].self_attn.q_proj.weight == 0)
    card = (tmp_path / "ct" / "README.md").read_text()
    assert "vllm serve" in card and "Command: `pytest`" in card and "Sparsity: 0.5" in card
    assert ("unquantized in float32" in card) == rotate


def test_packed_directory_converts_to_the_same_logits(tmp_path, tiny_tokenizer):
    pytest.importorskip("compressed_tensors", reason=CT_REASON)
    from transformers import AutoModelForCausalLM

    from toolkit.compress.packed import load_packed, save_packed
    from toolkit.compress.rotation import rotate_model
    from toolkit.export.compressed_tensors import save_compressed_tensors
    from toolkit.export.quantized import from_packed

    model = _tiny_llama(tie=False)
    view = view_of(model)
    rotation = rotate_model(view, seed=0)
    save_packed(view, tiny_tokenizer, tmp_path / "packed", _fake_quant(view, None), 4, _metadata(rotation))
    packed_model, _ = load_packed(tmp_path / "packed", with_tokenizer=False)
    save_compressed_tensors(from_packed(tmp_path / "packed"), tmp_path / "ct")
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "ct").eval()
    ids = torch.randint(0, 300, (1, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert _relative(reloaded(ids).logits, packed_model(ids).logits) <= 1e-5


def test_w4a4_and_kv4_models_are_refused():
    model = _tiny_llama(tie=True)
    view = view_of(model)
    scales = _fake_quant(view, None)
    for a_bits, kv_bits in ((4, 16), (16, 4)):
        q = from_model(view, None, scales, 4, _metadata(a_bits=a_bits, kv_bits=kv_bits))
        with pytest.raises(BadInputError, match="packed format"):
            check_exportable(q)


def test_gpt2_conv1d_is_not_supported_by_the_format():
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(vocab_size=100, n_positions=32, n_embd=32, n_layer=1, n_head=4)).eval()
    view = view_of(model)
    scales = _fake_quant(view, None, sparsity=0.0)
    q = from_model(view, None, scales, 4, _metadata())
    with pytest.raises(BadInputError, match="not supported by the compressed-tensors format"):
        check_exportable(q)
