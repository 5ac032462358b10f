"""TokUR's batched generation (`generate_batch` > 1) samples every question's candidates with the draws of the
one-question call: the same responses for prompts of different lengths (left padding), EOS handling included."""

import pytest
import torch


@pytest.mark.parametrize("model_dir", ["tiny_gpt2_dir", "tiny_llama_dir"])
def test_batched_sampling_equals_one_question_at_a_time(request, model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from toolkit.uq.run import sample_responses, sample_responses_batch

    path = request.getfixturevalue(model_dir)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 90, (length,), generator=g) for length in (5, 9, 2)]
    seeds = [11, 12, 13]
    with torch.no_grad():
        one = [sample_responses(model, tokenizer, p, 3, 12, 1.0, s) for p, s in zip(prompts, seeds)]
        batched = sample_responses_batch(model, tokenizer, prompts, 3, 12, 1.0, seeds)
    assert len(batched) == 3
    for single, joint in zip(one, batched):
        assert len(single) == len(joint) == 3
        for a, b in zip(single, joint):
            assert torch.equal(a, b)


def test_generate_batch_is_a_config_key():
    from toolkit.uq.config import TokURConfig

    assert TokURConfig.model_fields["generate_batch"].default == 1
    with pytest.raises(Exception):
        TokURConfig(model="m", data="d", generate_batch=0)
