"""The block pipeline (compress, onloaded compress) hands each block the masks and rotary embeddings the model
gives that block. Gemma 2/3 pick them per block by attention type (`config.layer_types[i]`: a full-attention block
every sixth in Gemma 3, RoPE base 1e6 there and 1e4 elsewhere); capturing them once at block 0 gave every
full-attention block the sliding one's, so calibration statistics from block 5 of Gemma 3 270M on were taken on
hidden states the model never computes."""

import pytest
import torch

from toolkit.models.tiny import build_tiny
from toolkit.nn.pipeline import run_sequential


def _alternating(model_type: str):
    torch.manual_seed(0)
    model = build_tiny(model_type, vocab_size=300, layers=4)
    model.config.layer_types = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]
    model.config.sliding_window = 4  # shorter than the windows: the masks differ by type too
    return type(model)(model.config).eval()


@pytest.mark.parametrize("model_type", ["gemma3_text", "gemma2"])
def test_each_block_gets_its_own_attention_type(model_type):
    model = _alternating(model_type)
    windows = torch.randint(3, 300, (2, 12))
    with torch.no_grad():
        expected = [model(w[None], output_hidden_states=True).hidden_states for w in windows]
    seen = {}
    run_sequential(model, windows, lambda step: seen.setdefault(step.index, [x.clone() for x in step.inputs]))
    for index in range(1, 4):  # block 0's input is the embedding; later ones are what the pipeline propagated
        for w in range(len(windows)):
            torch.testing.assert_close(seen[index][w], expected[w][index], rtol=1e-4, atol=1e-5)


def test_onloaded_stream_gives_each_block_its_own_attention_type(tmp_path, one_thread):
    """`--set onload=true` statistics and perplexity (toolkit/nn/onload_stats.BlockStream) record the kwargs the
    model gives every block too: with block 0's for all, the full-attention blocks of this model ran with the sliding
    window's mask and rotary base (the perplexity differed from the resident one)."""
    from toolkit.eval.onloaded import perplexity_onloaded
    from toolkit.eval.perplexity import perplexity
    from toolkit.models.lazy import LazyModel

    model = _alternating("gemma3_text")
    model.config.rope_local_base_freq = 10.0  # the two types' rotary embeddings differ by far (as 1e4 vs 1e6)
    model = type(model)(model.config).eval()
    model.save_pretrained(tmp_path / "m", max_shard_size="12KB")
    ids = torch.randint(3, 300, (60,), generator=torch.Generator().manual_seed(1))
    resident = perplexity(model, ids, max_length=20)
    onloaded = perplexity_onloaded(LazyModel(tmp_path / "m"), ids, max_length=20)
    assert onloaded["tokens"] == resident["tokens"]
    assert abs(onloaded["nll"] - resident["nll"]) <= 1e-5 * resident["nll"], (onloaded, resident)
