"""The value optimisation's fast forward (blocks L+1.. on block L's cached output, suffix tokens over a prefix KV
cache) must be the model's own forward when δ = 0, on every architecture the edit commands accept.

The Gemma 3 bug this pins: Gemma 2/3 (and other models with per-layer attention types) pick each block's mask and
rotary embedding by its *position* in the block list (`config.layer_types[i]`). Replacing blocks 0..L by one stub
shifted every upper block to the type of the block L positions below it, so on Gemma 3 270M (a full-attention block
every sixth, RoPE base 1e6 there and 1e4 elsewhere) δ was optimised for a different network than the one edited:
`edit memit -n 10` reached 10 % efficacy and erased the old answers without inserting the new ones.
"""

import pytest
import torch

from toolkit.edit.context import EditContext
from toolkit.edit.facts import EditRequest
from toolkit.edit.keys import prompt_rows
from toolkit.edit.values import _SuffixRunner, upper_blocks_only
from toolkit.models.tiny import build_tiny

REQUESTS = [EditRequest(prompt="The capital city of {} is", subject="the old country", target_new="the river",
                        record_id="r0"),
            EditRequest(prompt="{} plays the", subject="Tom", target_new="piano and more", record_id="r1")]


def _model(model_type: str, vocab: int):
    torch.manual_seed(0)
    model = build_tiny(model_type, vocab_size=vocab, layers=4)
    if getattr(model.config, "layer_types", None) is not None:
        # alternate types, so a shift by the edit layer's depth changes every upper block's type
        model.config.layer_types = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]
        model.config.sliding_window = model.config.sliding_window or 64
        model = type(model)(model.config).eval()
    return model.requires_grad_(False)


@pytest.mark.parametrize("model_type", ["llama", "gemma3_text", "gemma2", "qwen3"])
def test_upper_blocks_on_the_cache_equal_the_full_forward(model_type, tiny_tokenizer):
    model = _model(model_type, len(tiny_tokenizer))
    ectx = EditContext.of(model, tiny_tokenizer, "cpu", batch=8).with_templates(["", "A short prefix. "])
    rows = prompt_rows(tiny_tokenizer, REQUESTS, ectx.templates, with_target=True)
    layer = 1
    runner = _SuffixRunner(ectx, rows, layer)
    picked = list(range(len(rows)))
    with torch.no_grad():
        with upper_blocks_only(ectx, runner.stub, layer):
            runner.stub.delta = torch.zeros(len(REQUESTS), model.config.hidden_size)
            fast = runner.forward(picked)
        for k, row in enumerate(rows):
            full = ectx.base(input_ids=torch.tensor([row.ids])).last_hidden_state[0, row.subject_index:]
            torch.testing.assert_close(fast[k, :full.shape[0]], full, rtol=1e-4, atol=1e-4)
    assert len(getattr(ectx.base, ectx.blocks_name)) == 4  # the blocks are back after the context


def test_the_block_types_differ_where_the_shift_would_show():
    """The precondition: the tiny Gemma 3 has both attention types and a RoPE base per type."""
    model = _model("gemma3_text", 300)
    types = model.config.layer_types
    assert types[2] != types[1] and types[3] != types[2]
    rope = model.config.rope_parameters
    assert rope["full_attention"]["rope_theta"] != rope["sliding_attention"]["rope_theta"]
