"""A single MEMIT edit on a tiny model: δ makes the model say the target, and the closed-form insertion
reproduces z = h + δ at the edit layer from the weights alone (no hook).

An untrained tiny model routes almost nothing from one position to the next, so the prompt ends with the subject
and the target is one token: the edit has to work through the subject position itself."""

import torch

from toolkit.edit.facts import EditRequest
from toolkit.edit.memit import (
    Arch,
    MemitConfig,
    block_outputs,
    compute_keys,
    insert,
    optimise_values,
    prompt_rows,
)
from toolkit.edit.metrics import score_answers


def test_single_edit_reaches_target(tiny_gpt2_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_gpt2_dir).eval().requires_grad_(False)
    tokenizer = AutoTokenizer.from_pretrained(tiny_gpt2_dir)
    arch = Arch.of(model)
    request = EditRequest(prompt="The value of {}", subject="object", target_new="the", record_id="r0")
    config = MemitConfig(model="m", data="d", v_num_grad_steps=60, clamp_factor=10.0, kl_factor=0.0,
                         v_weight_decay=0.0, early_stop_loss=1e-3)
    layers, templates = [1], [""]
    before, = score_answers(model, tokenizer, [(request.text, request.target_new)], 4, "cpu")
    keys = compute_keys(model, arch, tokenizer, [request], templates, [1], 4, "cpu")[1]
    delta, h = optimise_values(model, arch, tokenizer, [request], templates, keys, config, 1, "cpu")
    width = keys.shape[-1]
    insert(model, arch, tokenizer, [request], templates, h + delta, layers,
           {l: torch.eye(width) for l in layers}, 1e-6, 4, "cpu")
    reached = block_outputs(model, arch, tokenizer, [request], 1, 4, "cpu")
    assert torch.allclose(reached, h + delta, rtol=1e-3, atol=1e-3)
    after, = score_answers(model, tokenizer, [(request.text, request.target_new)], 4, "cpu")
    assert not before["strict"] and after["strict"]
    assert len(prompt_rows(tokenizer, [request], templates, with_target=True)[0].targets) == 1
