"""TokUR's sampling (`toolkit.uq.run.sample_responses`) draws what transformers' own temperature sampling draws for
each prompt alone — the reference below is `generate(do_sample=True, num_return_sequences=n)` after
`torch.manual_seed(seed)` — whether the prompts go one per call (`generate_batch` 1) or several in one left-padded
call, for prompts of different lengths."""

import pytest
import torch


def hf_sampling(model, tokenizer, prompt_ids, n, max_new_tokens, temperature, seed):
    """Independent reference: transformers' sampler on one prompt, responses cut after the first EOS."""
    torch.manual_seed(seed)
    output = model.generate(prompt_ids.unsqueeze(0), do_sample=True, temperature=temperature, top_k=None,
                            top_p=None, max_new_tokens=max_new_tokens, num_return_sequences=n,
                            pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id,
                            attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long))
    responses = []
    for row in output[:, len(prompt_ids):]:
        ends = (row == tokenizer.eos_token_id).nonzero()
        responses.append(row[:int(ends[0]) + 1] if len(ends) else row)
    return responses


@pytest.mark.parametrize("model_dir", ["tiny_gpt2_dir", "tiny_llama_dir"])
def test_sampling_equals_transformers_per_prompt_alone_or_batched(request, model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from toolkit.uq.run import sample_responses

    path = request.getfixturevalue(model_dir)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 90, (length,), generator=g) for length in (5, 9, 2)]
    seeds = [11, 12, 13]
    with torch.no_grad():
        reference = [hf_sampling(model, tokenizer, p, 3, 12, 1.0, s) for p, s in zip(prompts, seeds)]
        alone = [sample_responses(model, tokenizer, [p], 3, 12, 1.0, [s])[0] for p, s in zip(prompts, seeds)]
        batched = sample_responses(model, tokenizer, prompts, 3, 12, 1.0, seeds)
    assert len(batched) == 3
    for expected, one, joint in zip(reference, alone, batched):
        assert len(expected) == len(one) == len(joint) == 3
        for a, b, c in zip(expected, one, joint):
            assert torch.equal(a, b) and torch.equal(a, c)


def test_generate_batch_is_a_config_key():
    from toolkit.uq.config import TokURConfig

    assert TokURConfig.model_fields["generate_batch"].default == 1
    with pytest.raises(Exception):
        TokURConfig(model="m", data="d", generate_batch=0)
