"""EAMET's value optimisation is sequential as in the official compute_z: request k aligns only to the final, frozen
δ of requests < k (never to a δ still moving in its own chunk), zero δ are no neighbours, and a request without
neighbours has no alignment term. The reference alignment below is written from the official keep_cs_structure
(KL(p ‖ q) with p = softmax(S_k/τ), q = softmax(S_r/τ), plus the top-50 weighted MSE), not from our code."""

import pytest
import torch
import torch.nn.functional as F

from toolkit.edit.context import EditContext
from toolkit.edit.eamet import EametConfig, EmbeddingAlignment
from toolkit.edit.facts import EditRequest
from toolkit.edit.keys import compute_keys
from toolkit.edit.values import optimise_values

pytestmark = pytest.mark.usefixtures("one_thread")

FACTS = [("The value of {}", "object", "the"), ("{} is located in", "the big house", "a red car"),
         ("Where is {}?", "a", "blue"), ("I think {} will", "Paris France today", "of the day"),
         ("{} was born in", "John", "London")]
TEMPLATES = ["", "Hello world. "]


@pytest.fixture(scope="module")
def setup(tiny_llama_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir).eval().requires_grad_(False)
    tokenizer = AutoTokenizer.from_pretrained(tiny_llama_dir)
    ectx = EditContext.of(model, tokenizer, "cpu", batch=4, templates=TEMPLATES)
    requests = [EditRequest(prompt=p, subject=s, target_new=t, record_id=f"r{i}") for i, (p, s, t) in enumerate(FACTS)]
    keys = compute_keys(ectx, requests, [1])[1]
    return ectx, requests, keys


def _config(**overrides):
    # a strong alignment so that it visibly moves δ on a tiny model; opt_batch 4 must not batch EAMET
    settings = dict(model="m", data="d", kl_factor=0.0, v_num_grad_steps=8, clamp_factor=10.0, cs_factor=5.0,
                    mse_factor=20.0, tau=0.5, opt_batch=4, early_stop_loss=1e-6)
    return EametConfig(**{**settings, **overrides})


class Spy(EmbeddingAlignment):
    """Records, at every loss call, which requests are asked for and which frozen δ they can see."""

    def __init__(self, config):
        super().__init__(config)
        self.calls = []

    def loss(self, delta, span):
        self.calls.append((span, self.deltas.clone() if self.deltas.numel() else torch.empty(0, delta.shape[-1])))
        return super().loss(delta, span)


def test_each_request_aligns_only_to_the_final_delta_of_earlier_requests(setup):
    ectx, requests, keys = setup
    config = _config()
    spy = Spy(config)
    spy.begin_batch(keys)
    delta, _, _ = optimise_values(ectx, requests, keys, config, 1, spy)
    final = F.normalize(delta, dim=-1)
    seen = sorted({(span.start, span.stop) for span, _ in spy.calls})
    assert seen == [(k, k + 1) for k in range(len(requests))]  # one request at a time despite opt_batch 4
    for span, frozen in spy.calls:
        k = span.start
        assert frozen.shape[0] == k  # exactly the requests before k, all finished
        assert torch.allclose(frozen, final[:k], atol=1e-6)  # their final δ, never a moving one


def _official_alignment(finished: list[torch.Tensor], keys: torch.Tensor, k: int, delta: torch.Tensor,
                        config: EametConfig) -> torch.Tensor:
    """keep_cs_structure of the official code for request k, with zero-δ rows left out and no term while δ_k = 0."""
    candidates = [j for j, d in enumerate(finished) if d.norm() > 0]
    if not candidates or delta.detach().norm() == 0:
        return delta.sum() * 0
    unit_keys = F.normalize(keys, dim=-1)
    sim_k = torch.stack([unit_keys[k] @ unit_keys[j] for j in candidates])
    r_new = F.normalize(delta, dim=0)
    sim_r = torch.stack([F.normalize(finished[j], dim=0) @ r_new for j in candidates])
    p, q = F.softmax(sim_k / config.tau, dim=0), F.softmax(sim_r / config.tau, dim=0)
    kl = torch.sum(p * torch.log(p / q))
    top = torch.topk(sim_k, min(config.top_m, len(candidates))).indices
    p_top = F.softmax(sim_k[top] / config.tau, dim=0)
    mse = torch.sum(p_top * (sim_k[top] - sim_r[top]) ** 2)
    return config.cs_factor * kl + config.mse_factor * mse


class OfficialOrder:
    """The official loop: request k is optimised alone against the list of final δ of requests 0..k-1 (a
    values.ValueAlignment: sequential, one request at a time)."""

    sequential = True

    def __init__(self, keys, config):
        self.keys, self.config, self.finished, self.k = keys, config, [], 0

    def begin_batch(self, keys_z):
        pass

    def loss(self, delta, span):
        assert len(span) == 1
        return _official_alignment(self.finished, self.keys, self.k, delta[0], self.config).reshape(1)

    def record(self, delta, span):
        self.finished.append(delta[0].detach().clone())


def test_values_equal_the_official_one_by_one_loop(setup):
    ectx, requests, keys = setup
    config = _config()
    ours = EmbeddingAlignment(config)
    ours.begin_batch(keys)
    delta, _, _ = optimise_values(ectx, requests, keys, config, 1, ours)
    official = OfficialOrder(keys, config)
    expected = []
    for k, request in enumerate(requests):
        official.k = k
        d, _, _ = optimise_values(ectx, [request], keys[k:k + 1], config, 1, official)
        expected.append(d)
    expected = torch.cat(expected)
    assert torch.allclose(delta, expected, atol=1e-4, rtol=1e-4)
    # the alignment is really acting: without it the later requests get other δ, the first one the same
    plain, _, _ = optimise_values(ectx, requests, keys, config, 1, None)
    assert torch.allclose(plain[0], delta[0], atol=1e-5)
    assert (plain[1:] - delta[1:]).norm(dim=-1).min() > 1e-3


def test_zero_delta_is_no_neighbour_and_no_neighbour_means_no_alignment():
    torch.manual_seed(0)
    config = EametConfig(model="m", data="d", tau=0.3)
    keys = torch.randn(4, 8)
    a, b = torch.randn(6), torch.randn(6)
    with_zero = EmbeddingAlignment(config)
    with_zero.begin_batch(keys)
    with_zero.record(torch.stack([a, torch.zeros(6), b]), range(3))
    without = EmbeddingAlignment(config)
    without.begin_batch(keys[[0, 2, 3]])
    without.record(torch.stack([a, b]), range(2))
    delta = torch.randn(1, 6, requires_grad=True)
    loss = with_zero.loss(delta, range(3, 4))
    assert loss.item() > 0
    assert torch.allclose(loss, without.loss(delta, range(2, 3)), atol=1e-6)
    reference = _official_alignment([a, torch.zeros(6), b], keys, 3, delta[0], config)
    assert loss.item() == pytest.approx(reference.item(), rel=1e-4)
    # every earlier request ended at δ = 0: no neighbour, zero loss and zero gradient
    lonely = EmbeddingAlignment(config)
    lonely.begin_batch(keys)
    lonely.record(torch.zeros(3, 6), range(3))
    loss = lonely.loss(delta, range(3, 4))
    (grad,) = torch.autograd.grad(loss.sum(), delta)
    assert loss.item() == 0 and torch.equal(grad, torch.zeros_like(grad))
