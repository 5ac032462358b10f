"""toolkit.nn.train.fit is the loops it replaced, bit for bit: a LambdaLR loop (DeepRAG, CoT, the backdoor
classifier) and a loop that writes the rate into the groups itself (the weight VAE), with clipping, a resumed
start and per-step callbacks; the schedules those loops wrote by hand equal toolkit.nn.schedule's."""

from __future__ import annotations

import math

import pytest
import torch

from toolkit.nn.schedule import linear_decay, linear_warmup, warmup_cosine
from toolkit.nn.train import epochs, fit, scaled

pytestmark = pytest.mark.usefixtures("one_thread")


def _net(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def _batches(n: int, seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)) for _ in range(n)]


def _loss(net, batch):
    x, y = batch
    return torch.nn.functional.cross_entropy(net(x), y)


def _same(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


def test_fit_equals_a_lambdalr_loop_bit_for_bit():
    steps, warmup, lr = 25, 5, 3e-2
    data = _batches(steps)

    def old_factor(step):  # DeepRAG's hand-written schedule before it moved to nn.schedule
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, steps - warmup))))

    ref = _net()
    optimizer = torch.optim.AdamW(ref.parameters(), lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, old_factor)
    ref_losses = []
    for batch in data:
        loss = _loss(ref, batch)
        loss.backward()
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
        ref_losses.append(loss.item())

    net = _net()
    optimizer = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=0.0)
    seen = []
    records = fit(optimizer, iter(data), lambda b: (lambda loss: (loss, loss.item()))(_loss(net, b)),
                  lr_at=scaled(optimizer, lambda s: warmup_cosine(s, steps, warmup)),
                  on_step=lambda step, loss, record: seen.append((step, optimizer.param_groups[0]["lr"])))
    assert records == ref_losses and _same(net, ref)
    assert [s for s, _ in seen] == list(range(steps))
    assert seen[0][1] == lr * old_factor(0) and seen[-1][1] == lr * old_factor(steps - 1)


def test_fit_equals_the_vae_loop_with_manual_rates_clipping_and_a_resumed_start():
    steps, start, warmup, peak, clip = 30, 7, 6, 5e-2, 0.5
    data = _batches(steps, seed=2)

    def old_rate(step):  # the weight VAE's learning_rate before it moved to nn.schedule
        if step < warmup:
            return peak * (step + 1) / warmup
        return peak * 0.5 * (1.0 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, steps - warmup))))

    ref = _net(3)
    optimizer = torch.optim.AdamW(ref.parameters(), lr=peak, betas=(0.9, 0.99), weight_decay=0.0)
    for step in range(start, steps):
        for group in optimizer.param_groups:
            group["lr"] = old_rate(step)
        loss = _loss(ref, data[step])
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(ref.parameters()), clip)
        optimizer.step()

    net = _net(3)
    optimizer = torch.optim.AdamW(net.parameters(), lr=peak, betas=(0.9, 0.99), weight_decay=0.0)
    done = []
    fit(optimizer, iter(data[start:] + data[:3]), lambda b: _loss(net, b), start=start, steps=steps,
        clip=(net.parameters(), clip), lr_at=lambda s: warmup_cosine(s, steps, warmup, peak=peak),
        on_step=lambda step, loss, record: done.append(step))
    assert done == list(range(start, steps)) and _same(net, ref)


def test_schedules_equal_the_forms_the_loops_wrote_by_hand():
    for steps in (1, 13, 2000):
        for warmup in (0, 1, 5, 500):
            for peak in (1e-4, 3e-3, 1.0):
                for s in range(0, steps, max(1, steps // 97)):
                    if s < warmup:
                        vae = peak * (s + 1) / warmup
                    else:
                        vae = peak * 0.5 * (1.0 + math.cos(math.pi * min(1.0, (s - warmup) / max(1, steps - warmup))))
                    assert warmup_cosine(s, steps, warmup, peak=peak) == vae
                    cot = min(1.0, (s + 1) / max(1, warmup))  # CoT: warm-up then constant
                    assert peak * linear_warmup(s, max(1, warmup)) == peak * cot
                    assert linear_decay(s, steps) == max(0.0, 1 - s / max(steps, 1))  # the backdoor classifier
    assert linear_decay(5, 0) == 0.0 and linear_decay(0, 0) == 1.0


def test_epochs_reshuffles_each_pass_and_stops_on_an_empty_loader():
    g = torch.Generator().manual_seed(0)
    loader = torch.utils.data.DataLoader(list(range(6)), batch_size=2, shuffle=True, generator=g)
    stream = epochs(loader)
    first = [next(stream).tolist() for _ in range(3)]
    second = [next(stream).tolist() for _ in range(3)]
    assert sorted(sum(first, [])) == sorted(sum(second, [])) == list(range(6))
    assert list(epochs([])) == []
    with pytest.raises(ValueError):
        two = torch.optim.SGD([{"params": [torch.zeros(1)], "lr": 1.0}, {"params": [torch.zeros(1)], "lr": 2.0}])
        scaled(two, lambda s: 1.0)
