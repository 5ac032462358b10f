"""Models that came from a GGUF file save as plain checkpoints (the SmolLM2 zoo bug: every command that saved a
model derived from zoo:smollm2-135m failed with "quantized with gguf and is not serializable")."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM
from transformers.quantizers.quantizer_gguf import GgufHfQuantizer
from transformers.utils.quantization_config import GgufConfig

from toolkit.models.save import is_gguf_quantized, plain_config, save_model


def _gguf_loaded_llama():
    """A tiny Llama in the state `from_pretrained(..., gguf_file=...)` leaves: GGUF quantizer + quantization_config."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = LlamaForCausalLM(config).eval()
    gguf = GgufConfig(gguf_file="tiny.Q4_1.gguf")
    model.config.quantization_config = gguf
    model.hf_quantizer = GgufHfQuantizer(gguf)
    return model


def test_transformers_refuses_the_gguf_state(tmp_path):
    """The precondition the fix is about: transformers itself will not save such a model."""
    with pytest.raises(ValueError, match="not serializable"):
        _gguf_loaded_llama().save_pretrained(tmp_path / "raw")


def test_save_model_writes_a_plain_checkpoint_that_reloads(tmp_path):
    model = _gguf_loaded_llama()
    ids = torch.arange(10).unsqueeze(0)
    with torch.no_grad():
        expected = model(ids).logits
    out = save_model(model, None, tmp_path / "m", technique="test", source="tiny.gguf")
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config
    reloaded = AutoModelForCausalLM.from_pretrained(out).eval()
    assert not is_gguf_quantized(reloaded) and getattr(reloaded, "hf_quantizer", None) is None
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids).logits, expected, rtol=0, atol=0)


def test_plain_config_drops_only_the_quantization_config():
    model = _gguf_loaded_llama()
    clean = plain_config(model.config)
    assert not hasattr(clean, "quantization_config") or clean.quantization_config is None
    assert clean.to_dict()["hidden_size"] == 32 and clean.num_key_value_heads == 2


def test_a_stale_gguf_config_on_disk_still_saves(tmp_path):
    """A zoo cache written before the fix has `quantization_config: gguf` in config.json: loading it and saving a
    derived model (what compress/edit/unlearn/merge do through save_model) works."""
    model = _gguf_loaded_llama()
    del model.hf_quantizer
    src = tmp_path / "stale"
    model.config.quantization_config = None
    model.save_pretrained(src)
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "gguf", "gguf_file": "tiny.Q4_1.gguf", "dequantize": False}
    (src / "config.json").write_text(json.dumps(config))
    from toolkit.models.source import load_model

    loaded, _ = load_model(str(src), with_tokenizer=False)
    out = save_model(loaded, None, tmp_path / "derived", technique="test", source=str(src))
    assert "quantization_config" not in json.loads((out / "config.json").read_text())
    AutoModelForCausalLM.from_pretrained(out)
