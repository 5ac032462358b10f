"""EAMET's alignment losses against brute-force references; the KL direction is pinned (KL(P_k ‖ P_r))."""

import math

import torch

from toolkit.edit.eamet import EametConfig, EmbeddingAlignment, alignment_losses


def _softmax(values, tau):
    exps = [math.exp(v / tau) for v in values]
    return [e / sum(exps) for e in exps]


def test_alignment_losses_match_brute_force_and_kl_direction():
    torch.manual_seed(0)
    tau, top_m = 0.5, 2
    key_sim = torch.rand(3, 4) * 2 - 1
    delta_sim = torch.rand(3, 4) * 2 - 1
    valid = torch.tensor([[False] * 4, [True, False, False, False], [True, True, True, False]])
    kl, mse = alignment_losses(key_sim, delta_sim, valid, tau, top_m)
    assert kl[0] == 0 and mse[0] == 0  # no earlier fact: no alignment
    for row in (1, 2):
        cols = [j for j in range(4) if valid[row, j]]
        pk = _softmax([key_sim[row, j].item() for j in cols], tau)
        pr = _softmax([delta_sim[row, j].item() for j in cols], tau)
        forward = sum(p * math.log(p / q) for p, q in zip(pk, pr))
        assert math.isclose(kl[row].item(), forward, rel_tol=1e-4, abs_tol=1e-6)
        top = sorted(cols, key=lambda j: -key_sim[row, j].item())[:top_m]
        weights = _softmax([key_sim[row, j].item() for j in top], tau)
        brute = sum(w * (key_sim[row, j].item() - delta_sim[row, j].item()) ** 2 for w, j in zip(weights, top))
        assert math.isclose(mse[row].item(), brute, rel_tol=1e-4, abs_tol=1e-7)
    cols = [0, 1, 2]
    pk = _softmax([key_sim[2, j].item() for j in cols], tau)
    pr = _softmax([delta_sim[2, j].item() for j in cols], tau)
    reverse = sum(q * math.log(q / p) for p, q in zip(pk, pr))
    assert not math.isclose(kl[2].item(), reverse, rel_tol=1e-3)


def test_alignment_sees_only_earlier_requests_and_is_zero_when_aligned():
    torch.manual_seed(1)
    config = EametConfig(model="m", data="d", tau=0.1, top_m=50)
    align = EmbeddingAlignment(config)
    keys = torch.randn(4, 8)
    align.begin_batch(keys)
    # nothing finished yet: no neighbour, no alignment (a δ still being optimised is never a neighbour)
    assert torch.equal(align.loss(keys.clone(), range(4)), torch.zeros(4))
    align.record(keys[:2], range(2))
    # δ = keys: identical similarity structure to the finished ones -> both losses vanish
    assert torch.allclose(align.loss(keys[2:].clone(), range(2, 4)), torch.zeros(2), atol=1e-5)
    later = align.loss(torch.randn(2, 8), range(2, 4))
    assert later.shape == (2,) and (later > 0).all()


def test_zero_delta_rows_get_no_alignment_gradient():
    """δ = 0 (zero start, or the target start when ‖h‖ ≥ 100) has no direction; a cosine there once gave a 1e12
    gradient that froze δ under Adam. Such rows get no alignment loss; the others keep theirs, finite."""
    torch.manual_seed(2)
    align = EmbeddingAlignment(EametConfig(model="m", data="d", tau=0.07))
    align.begin_batch(torch.randn(7, 8))
    align.record(torch.randn(3, 6), range(3))  # three finished neighbours
    delta = torch.randn(4, 6)
    delta[2] = 0
    delta.requires_grad_(True)
    loss = align.loss(delta, range(3, 7))
    grad, = torch.autograd.grad(loss.sum(), delta)
    assert loss[2] == 0 and torch.equal(grad[2], torch.zeros(6))
    assert torch.isfinite(grad).all() and grad.abs().max() < 100 and loss[3] > 0
