"""Gradient clipping in the shared unlearning loop (PRISM, GA, NPO, RMU all step through `train`): the total gradient
norm handed to AdamW is at most max_grad_norm (HF Trainer default 1.0), the direction is kept, and with clipping off
the gradient is exactly the unclipped one."""

import math

import pytest
import torch

from toolkit.core.context import RunContext
from toolkit.core.errors import RunError
from toolkit.unlearn.baselines import GaConfig, NpoConfig, RmuConfig
from toolkit.unlearn.losses import mean_nll
from toolkit.unlearn.prism import PrismConfig
from toolkit.unlearn.train import Corpus, UnlearnConfig, train

pytestmark = pytest.mark.usefixtures("one_thread")

SCALE = 1e4  # a huge learning signal: the raw gradient norm is far above 1


def _corpus():
    torch.manual_seed(3)
    return Corpus(forget=[torch.randint(1, 200, (8,)) for _ in range(2)], pad=0)


def _objective(s):
    loss = -SCALE * mean_nll(s.model(**s.forget).logits, s.forget["input_ids"], s.forget["attention_mask"])
    s.backward(loss)
    return {"loss": loss.item()}


def _one_step(tiny_gpt2_dir, **overrides):
    """Run one step of `train`; the gradients it stepped with are still in p.grad afterwards."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_gpt2_dir).eval()
    config = UnlearnConfig(model="x", forget="x", batch_size=2, max_steps=1, lr=1e-3, **overrides)
    result = train(config, RunContext(out=None, quiet=True), model, _corpus(), _objective,
                   list(model.parameters()), "t")
    return result, [p.grad.detach().clone() for p in result["model"].parameters()]


def _reference_grads(tiny_gpt2_dir):
    """The unclipped gradient computed directly, outside the loop."""
    from transformers import AutoModelForCausalLM

    from toolkit.unlearn.data import batch_indices, collate

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_gpt2_dir).eval()
    corpus = _corpus()
    picked = batch_indices(len(corpus.forget), 2, 0, RunContext(out=None, quiet=True).seed)
    batch = collate([corpus.forget[i] for i in picked], 0)
    (-SCALE * mean_nll(model(**batch).logits, batch["input_ids"], batch["attention_mask"])).backward()
    return [p.grad.detach().clone() for p in model.parameters()]


def _norm(grads):
    return math.sqrt(sum(float((g.double() ** 2).sum()) for g in grads))


def test_default_is_the_hf_trainer_value_for_every_method():
    for cls in (UnlearnConfig, PrismConfig, NpoConfig, GaConfig, RmuConfig):
        assert cls(model="x", forget="x").max_grad_norm == 1.0
    with pytest.raises(Exception):
        UnlearnConfig(model="x", forget="x", max_grad_norm=-1.0)


def test_clipped_step_has_total_norm_at_most_max_and_keeps_the_direction(tiny_gpt2_dir):
    raw = _reference_grads(tiny_gpt2_dir)
    raw_norm = _norm(raw)
    assert raw_norm > 100.0  # the test is only meaningful when clipping must act
    result, clipped = _one_step(tiny_gpt2_dir)
    assert _norm(clipped) <= 1.0 + 1e-4
    assert _norm(clipped) == pytest.approx(1.0, rel=1e-4)
    assert result["history"][0]["grad_norm"] == pytest.approx(raw_norm, rel=1e-4)  # logged before clipping
    for c, r in zip(clipped, raw):  # clip = raw · (max / ‖raw‖): same direction
        assert torch.allclose(c, r / raw_norm, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("off", [None, 0.0])
def test_clipping_off_is_exactly_the_unclipped_step(tiny_gpt2_dir, off):
    raw = _reference_grads(tiny_gpt2_dir)
    result, grads = _one_step(tiny_gpt2_dir, max_grad_norm=off)
    assert "grad_norm" not in result["history"][0]
    for g, r in zip(grads, raw):
        assert torch.allclose(g, r, atol=1e-5, rtol=1e-5)


def test_a_small_gradient_is_left_alone(tiny_gpt2_dir):
    raw = _reference_grads(tiny_gpt2_dir)
    _, grads = _one_step(tiny_gpt2_dir, max_grad_norm=10 * _norm(raw))
    for g, r in zip(grads, raw):
        assert torch.allclose(g, r, atol=1e-5, rtol=1e-5)


def test_a_non_finite_gradient_norm_stops_the_run(tiny_gpt2_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_gpt2_dir).eval()

    def poisoned(s):
        _objective(s)
        next(iter(s.params)).grad[0, 0] = float("inf")
        return {"loss": 0.0}

    config = UnlearnConfig(model="x", forget="x", batch_size=2, max_steps=1)
    with pytest.raises(RunError, match="non-finite gradient norm"):
        train(config, RunContext(out=None, quiet=True), model, _corpus(), poisoned, list(model.parameters()), "t")
