"""Per-layer statistics with one block in memory (`--set onload=true`): edit's key covariance, remove-ln's DLA and CE
and steer's activations, read block by block from a sharded safetensors checkpoint, equal the resident paths; at
most one block is loaded at a time and each is freed."""

import pytest
import torch

from toolkit.models.lazy import INDEX, LazyModel

pytestmark = pytest.mark.usefixtures("one_thread")


def _loaded_blocks(lazy) -> int:
    return sum(any(p.device.type != "meta" for p in layer.parameters()) for layer in lazy.layers)


def _probe(lazy, seen):
    return lambda _: seen.append(_loaded_blocks(lazy))


def sharded(family: str, path, tokenizer, layers: int = 3):
    """A tiny random `family` decoder (toolkit.models.tiny) with the tokenizer's vocabulary, saved in several
    safetensors shards with its tokenizer."""
    from toolkit.models.tiny import build_tiny

    torch.manual_seed(0)
    build_tiny(family, len(tokenizer), layers=layers).save_pretrained(path, max_shard_size="40KB")
    tokenizer.save_pretrained(path)
    assert (path / INDEX).is_file()
    return path


@pytest.mark.parametrize("kind", ["llama", "gpt2", "opt", "gemma3_text"])
def test_onloaded_key_covariance_equals_resident_and_shares_its_cache(kind, tmp_path, tiny_tokenizer):
    from transformers import AutoModelForCausalLM

    from toolkit.data.text import embedded_text
    from toolkit.edit.context import EditContext
    from toolkit.edit.covariance import (
        checkpoint_fingerprint,
        key_covariance,
        key_covariance_onloaded,
        model_fingerprint,
    )

    source, tokenizer = sharded(kind, tmp_path / kind, tiny_tokenizer), tiny_tokenizer
    text = embedded_text()[:20_000]
    model = AutoModelForCausalLM.from_pretrained(source).eval()
    resident = key_covariance(EditContext.of(model, tokenizer, "cpu"), [0, 1], text, 700, 32, tmp_path / "a")
    lazy = LazyModel(source)
    assert checkpoint_fingerprint(lazy) == model_fingerprint(model)  # the same cache files as the resident path
    seen = []
    onloaded = key_covariance_onloaded(lazy, tokenizer, [0, 1], text, 700, 32, tmp_path / "b",
                                       probe=_probe(lazy, seen))
    assert max(seen) == 1 and _loaded_blocks(lazy) == 0  # one block at a time, freed after
    assert len(seen) == 1 + 2 * 2  # the embeddings, then blocks 0 and 1 only (block 2 is never read)
    for layer in (0, 1):
        want, got = resident[layer], onloaded[layer]
        assert want.shape == got.shape and want.shape[0] >= 64  # the MLP's intermediate width
        assert (got - want).norm() <= 1e-6 * want.norm(), (layer, (got - want).norm() / want.norm())
    names = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "b").iterdir())
    cached = key_covariance_onloaded(LazyModel(source), tokenizer, [1], text, 700, 32, tmp_path / "a")
    assert torch.equal(cached[1], resident[1])  # found in the resident path's cache


@pytest.mark.parametrize("which", ["ln_free", "original"])
def test_onloaded_dla_and_ce_equal_resident(which, tmp_path):
    from test_remove_ln import removed_model, tiny_gpt2
    from transformers import GPT2LMHeadModel

    from toolkit.remove_ln.analyze import analyze_onloaded, ce_windows, direct_logit_attribution
    from toolkit.remove_ln.export import to_plain
    from toolkit.remove_ln.train import window_ce

    model = to_plain(removed_model()[1]) if which == "ln_free" else tiny_gpt2(layers=3)
    model.save_pretrained(tmp_path / which, max_shard_size="20KB")
    assert (tmp_path / which / INDEX).is_file()
    model = GPT2LMHeadModel.from_pretrained(tmp_path / which).eval()
    ids = torch.randint(1, 97, (300,), generator=torch.Generator().manual_seed(3))
    windows = ids[:4 * 16].view(4, 16)
    want, want_ce = direct_logit_attribution(model, windows), window_ce(model, ids, 16, 18, "cpu")
    lazy, seen = LazyModel(tmp_path / which), []
    got, got_ce = analyze_onloaded(lazy, windows, ce_windows(ids, 16, 18), probe=_probe(lazy, seen))
    assert max(seen) == 1 and _loaded_blocks(lazy) == 0
    assert abs(got_ce - want_ce) <= 1e-6 * want_ce
    assert got["scale"] == pytest.approx(want["scale"], rel=1e-6)
    assert list(got["per_component"]) == list(want["per_component"])  # embed, pos_embed, L0.H0.. L0.mlp, ...
    top = max(abs(v) for v in want["per_component"].values())
    for name, value in want["per_component"].items():
        assert abs(got["per_component"][name] - value) <= 1e-5 * top, name
    assert got["max_abs_logit"] == pytest.approx(want["max_abs_logit"], rel=1e-6)
    if which == "ln_free":  # the components sum to the logits either way
        assert got["max_abs_err"] < 1e-4 and want["max_abs_err"] < 1e-4
    else:
        assert got["max_abs_err"] == pytest.approx(want["max_abs_err"], rel=1e-4)


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
@pytest.mark.parametrize("position", ["last", "mean"])
def test_onloaded_steer_activations_equal_resident(kind, position, tmp_path, tiny_tokenizer):
    from transformers import AutoModelForCausalLM

    from toolkit.steer.intervene import model_fingerprint, read_activations, read_activations_onloaded

    source = sharded(kind, tmp_path / kind, tiny_tokenizer)
    texts = ["The soldier drew his sword", "A cat", "Bread is baked in an oven every morning", "Rain fell",
             "The river ran", "He said hello to the crowd"]
    model = AutoModelForCausalLM.from_pretrained(source).eval()
    want = read_activations(model, tiny_tokenizer, texts, [0, 1], position, batch_size=4)
    lazy, seen = LazyModel(source), []
    got, fingerprint = read_activations_onloaded(lazy, tiny_tokenizer, texts, [0, 1], position, batch_size=4,
                                                 probe=_probe(lazy, seen))
    assert fingerprint == model_fingerprint(model)  # directions made onloaded apply to the resident model
    assert max(seen) == 1 and _loaded_blocks(lazy) == 0 and len(seen) == 1 + 2 * 2  # block 2 never read
    for layer in (0, 1):
        assert got[layer].shape == want[layer].shape == (len(texts), model.config.hidden_size)
        assert torch.allclose(got[layer], want[layer], rtol=1e-5, atol=1e-5 * want[layer].abs().max()), layer
