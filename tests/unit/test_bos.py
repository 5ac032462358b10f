"""A model's tokenizer conventions are honoured: where the tokenizer puts BOS first (Llama, Gemma), perplexity windows
and calibration windows start with it, as transformers' own evaluation does; a GPT-2 style tokenizer adds nothing.
Checked against transformers' loss on [BOS] + the window's tokens, and recorded in run.json."""

import json
import math

import pytest
import torch

from toolkit.eval.perplexity import perplexity, window_plan
from toolkit.models.tokens import bos_id


@pytest.fixture(scope="module")
def bos_tokenizer(tiny_tokenizer):
    """The tiny tokenizer with a post-processor that puts its special token first (as Llama's adds <s>)."""
    import copy

    from tokenizers.processors import TemplateProcessing

    tokenizer = copy.deepcopy(tiny_tokenizer)
    special = tokenizer.bos_token
    tokenizer.backend_tokenizer.post_processor = TemplateProcessing(
        single=f"{special} $A", special_tokens=[(special, tokenizer.bos_token_id)])
    return tokenizer


def test_bos_id_follows_the_tokenizer(tiny_tokenizer, bos_tokenizer):
    assert bos_id(tiny_tokenizer) is None  # byte-level BPE adds nothing
    assert bos_id(bos_tokenizer) == bos_tokenizer.bos_token_id
    assert bos_tokenizer("a")["input_ids"][0] == bos_tokenizer.bos_token_id


def test_windows_with_bos_score_every_token_once():
    ids = torch.arange(100)
    for max_length, stride in ((16, None), (16, 8), (33, 10)):
        scored = []
        for begin, end, score_from in window_plan(ids, max_length, stride, bos=True):
            assert end - begin + 1 <= max_length  # the BOS counts toward the model's context
            scored += list(range(begin + score_from, end))  # targets: every window token after BOS
        assert scored == list(range(100))


def test_perplexity_with_bos_equals_transformers_loss_on_bos_first(tiny_llama_dir, bos_tokenizer):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir).eval()
    ids = torch.tensor(bos_tokenizer("the quick brown fox jumps over the lazy dog " * 4,
                                     add_special_tokens=False)["input_ids"])[:31]
    bos = bos_id(bos_tokenizer)
    ours = perplexity(model, ids, max_length=32, bos=bos)
    window = torch.cat([torch.tensor([bos]), ids])[None]
    with torch.no_grad():
        reference = math.exp(model(window, labels=window).loss.item())
    assert ours["tokens"] == 31 and ours["ppl"] == pytest.approx(reference, rel=1e-5)
    plain = perplexity(model, ids, max_length=32)
    assert plain["tokens"] == 30 and plain["ppl"] != pytest.approx(ours["ppl"], rel=1e-3)


def test_calibration_windows_start_with_bos(bos_tokenizer, tiny_tokenizer):
    from toolkit.data.text import calibration_windows, embedded_text

    text = embedded_text()[:20_000]
    with_bos = calibration_windows(bos_tokenizer, text, 4, 16, seed=0)
    assert with_bos.shape == (4, 16) and (with_bos[:, 0] == bos_tokenizer.bos_token_id).all()
    assert (calibration_windows(tiny_tokenizer, text, 4, 16, seed=0)[:, 0] != tiny_tokenizer.bos_token_id).any()


def test_eval_ppl_records_the_convention(cli, tiny_llama_dir, bos_tokenizer, tmp_path, text_file):
    import shutil

    model = tmp_path / "model"
    shutil.copytree(tiny_llama_dir, model)
    bos_tokenizer.save_pretrained(model)
    result = cli(["eval", "ppl", "-m", model, "-d", text_file, "--max-length", "32", "--max-windows", "2",
                  "-o", tmp_path / "out", "--json"])
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["metrics"]["bos"] is True
