"""GGUF Q4_0 export: blocks decode (gguf's own dequantizer) to codes × fp16(scale), the q/k permutation is the one
transformers' GGUF loader undoes, and `from_pretrained(dir, gguf_file=...)` reproduces the in-memory model."""

import numpy as np
import pytest
import torch

from toolkit.compress.quant import fit_weight_scale, quantize_rows
from toolkit.core.errors import BadInputError
from toolkit.export.gguf import check_exportable, permute_rows, q4_0_bytes, read_gguf_weights, save_gguf
from toolkit.export.quantized import from_model
from toolkit.models.view import view_of

pytestmark = pytest.mark.usefixtures("one_thread")


def test_q4_0_blocks_decode_to_codes_times_fp16_scale():
    import gguf
    from gguf.quants import dequantize

    gen = np.random.default_rng(0)
    codes = gen.integers(-8, 8, size=(3, 96))
    scales = gen.uniform(1e-3, 1e-1, size=(3, 3)).astype(np.float32)
    raw = q4_0_bytes(codes, scales)
    assert raw.shape == (3, 3 * 18) and raw.dtype == np.uint8
    decoded = dequantize(raw, gguf.GGMLQuantizationType.Q4_0).reshape(3, 96)
    expected = codes * np.repeat(scales.astype(np.float16).astype(np.float32), 32, axis=1)
    assert np.array_equal(decoded, expected)


def test_qk_permutation_is_what_the_transformers_gguf_loader_undoes():
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    rows = np.arange(48 * 5, dtype=np.float32).reshape(48, 5)  # 4 heads of dim 12 (or 2 KV heads of 24)
    processor = LlamaTensorProcessor(config={"num_attention_heads": 4, "num_key_value_heads": 2})
    for name, heads in (("blk.0.attn_q.weight", 4), ("blk.0.attn_k.weight", 2)):
        back = processor.process(permute_rows(rows, heads), name).weights
        assert np.array_equal(back, rows)
    # within one head of dim 4: rows (0, 2) and (1, 3) are the RoPE pairs, which llama.cpp wants adjacent
    assert permute_rows(np.arange(4.0).reshape(4, 1), 1).ravel().tolist() == [0.0, 2.0, 1.0, 3.0]


def _fake_quant(view) -> dict:
    """Per-channel RTN with half of each row pruned by magnitude; weights set to codes × scale in place."""
    scales = {}
    for i, block in enumerate(view.blocks):
        for slot in view.slots(i):
            W = slot.weight(block)
            keep = W.abs() > W.abs().quantile(0.5, dim=1, keepdim=True)
            name = view.full_name(i, slot)
            scales[name] = fit_weight_scale(W, 4)
            slot.set_weight(block, quantize_rows(W * keep, scales[name], 4))
    return scales


def _quantized_llama(tokenizer, rotate: bool):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         tie_word_embeddings=not rotate)
    model = LlamaForCausalLM(config).eval()
    view = view_of(model)
    rotation = None
    if rotate:
        from toolkit.compress.rotation import rotate_model

        rotation = rotate_model(view, seed=1)
    scales = _fake_quant(view)
    metadata = {"method": "rtn", "w_bits": 4, "a_bits": 16, "kv_bits": 16, "sparsity": 0.5, "rotation": rotation}
    return model, from_model(view, tokenizer, scales, 4, metadata, {"source_model": "tiny"})


@pytest.mark.parametrize("rotate", [False, True])
def test_gguf_round_trip_and_transformers_logits(tmp_path, tiny_tokenizer, rotate):
    from transformers import AutoModelForCausalLM

    model, q = _quantized_llama(tiny_tokenizer, rotate)
    summary = save_gguf(q, tmp_path, card={"command": "pytest"})
    assert summary["tensors"]["Q4_0"] == (12 if rotate else 14) and summary["float_ffn_down"] == (2 if rotate else 0)
    weights = read_gguf_weights(tmp_path / "model-Q4_0.gguf")
    assert ("output.weight" in weights) == rotate  # tied embeddings are written once
    for i in range(2):
        for gguf_name, path, heads in (("attn_q", "self_attn.q_proj", 4), ("attn_k", "self_attn.k_proj", 2),
                                       ("ffn_gate", "mlp.gate_proj", None)):
            grid = q.linears[f"model.layers.{i}.{path}"]
            expected = (grid.codes.float() * grid.scales.half().float()).numpy()
            stored = weights[f"blk.{i}.{gguf_name}.weight"]
            assert np.array_equal(stored, permute_rows(expected, heads) if heads else expected)
            true = model.get_submodule(f"model.layers.{i}.{path}").weight.detach().numpy()
            assert np.abs(expected - true).max() <= 2**-11 * np.abs(true).max()  # fp16 scale rounding only
            assert np.array_equal(expected == 0, true == 0)  # pruned weights stay exactly zero
    # reference: the in-memory model with the same fp16-rounded scales (hooks and all)
    with torch.no_grad():
        for path, grid in q.linears.items():
            if rotate and path.endswith("down_proj"):
                continue
            model.get_submodule(path).weight.copy_(grid.codes.float() * grid.scales.half().float())
    ids = torch.randint(0, len(tiny_tokenizer), (2, 16), generator=torch.Generator().manual_seed(3))
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file="model-Q4_0.gguf", dtype=torch.float32).eval()
    with torch.no_grad():
        reference, out = model(ids).logits, loaded(ids).logits
    assert float((out - reference).abs().max() / reference.abs().max()) <= 1e-5
    card = (tmp_path / "README.md").read_text()
    assert "llama-cli -m" in card and "d = fp16(row scale)" in card and "Command: `pytest`" in card


def test_gguf_refuses_what_q4_0_cannot_hold(tiny_tokenizer):
    _, q = _quantized_llama(tiny_tokenizer, rotate=False)
    q.metadata["a_bits"] = 4
    with pytest.raises(BadInputError, match="packed format"):
        check_exportable(q)
    q.metadata["a_bits"] = 16
    q.bits = 3
    with pytest.raises(BadInputError, match="4-bit"):
        check_exportable(q)


def test_gguf_refuses_an_architecture_llama_cpp_has_no_loader_for():
    from transformers import OPTConfig, OPTForCausalLM

    model = OPTForCausalLM(OPTConfig(vocab_size=100, hidden_size=32, ffn_dim=64, num_hidden_layers=1,
                                     num_attention_heads=4, word_embed_proj_dim=32, max_position_embeddings=32)).eval()
    q = from_model(view_of(model), None, {}, 4, {"a_bits": 16, "kv_bits": 16})
    with pytest.raises(BadInputError, match="llama.cpp has no loader for opt"):
        check_exportable(q)
