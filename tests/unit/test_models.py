import pytest
import torch

from toolkit.core.errors import BadInputError, ResourceError
from toolkit.models.save import read_metadata, save_model
from toolkit.models.source import load_model, resolve_model_path


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
