"""Keys averaged as the official compute_ks (MEMIT and EAMET): the mean over context types (bare prompt; generated
prefixes) of the mean within each type, checked against states read template by template."""

import pytest
import torch

from toolkit.edit.context import EditContext
from toolkit.edit.facts import EditRequest
from toolkit.edit.keys import compute_keys, context_type_weights, prompt_rows, subject_states

pytestmark = pytest.mark.usefixtures("one_thread")


def test_context_type_weights_by_hand():
    assert context_type_weights([""]) == [1.0]
    assert context_type_weights(["", "A. ", "B. "]) == [0.5, 0.25, 0.25]
    assert context_type_weights(["", "A. ", "B. ", "C. ", "D. "]) == [0.5, 0.125, 0.125, 0.125, 0.125]
    assert context_type_weights(["A. ", "B. "]) == [0.5, 0.5]  # one type only: the plain mean
    assert sum(context_type_weights([""] + [f"{i}. " for i in range(12)])) == pytest.approx(1.0)


def test_keys_are_the_mean_of_per_context_type_means(tiny_llama_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir).eval().requires_grad_(False)
    tokenizer = AutoTokenizer.from_pretrained(tiny_llama_dir)
    ectx = EditContext.of(model, tokenizer, "cpu", batch=3)
    requests = [EditRequest(prompt="The value of {}", subject="object", target_new="the", record_id="a"),
                EditRequest(prompt="{} is located in", subject="the big house", target_new="red", record_id="b")]
    templates = ["", "Hello world. ", "It was a day. ", "You see. "]
    keys = compute_keys(ectx.with_templates(templates), requests, [1])[1]
    for r, request in enumerate(requests):
        per_template = []
        for template in templates:  # one template at a time: independent of the batched weighting
            rows = prompt_rows(tokenizer, [request], [template], with_target=False)
            one = EditContext.of(model, tokenizer, "cpu", batch=1)
            per_template.append(subject_states(one, rows, [one.down(1)], "input")[one.down(1)][0])
        expected = 0.5 * per_template[0] + 0.5 * torch.stack(per_template[1:]).mean(0)
        assert torch.allclose(keys[r], expected, atol=1e-5)
        flat = torch.stack(per_template).mean(0)  # the old flat mean over templates is a different key
        assert not torch.allclose(keys[r], flat, atol=1e-4)
