"""The one optimisation loop of the house: set the step's learning rate, loss, backward, clip, step.

Every hand-written loop had the same body (DeepRAG's SFT/DPO, the CoT study, the weight VAE's two stages, the
backdoor defense's classifier); they differ only in where batches come from, what the loss is, the schedule and
what happens after a step, so those are the arguments:

    fit(optimizer, batches, loss_of, lr_at=lambda s: peak * warmup_cosine(s, total, warmup), clip=(params, 1.0))

`lr_at(step)` returns the step's learning rate and is written into every parameter group before the step: the
value `LambdaLR(optimizer, factor)` would hold (base_lr · factor(step)), so loops that used a LambdaLR keep their
rates bit for bit. The loop does not call model.train()/eval(), seed, or move tensors: the caller owns those.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, Iterable, Iterator

import torch


def epochs(loader: Iterable) -> Iterator:
    """The loader's batches again and again (each pass is a new epoch: a shuffling sampler reshuffles); stops if
    one pass yields nothing, instead of looping for ever."""
    while True:
        empty = True
        for batch in loader:
            empty = False
            yield batch
        if empty:
            return


def scaled(optimizer, factor: Callable[[int], float]) -> Callable[[int], float]:
    """lr_at = base_lr · factor(step) for each group's initial rate, as torch's LambdaLR computes it."""
    bases = [group["lr"] for group in optimizer.param_groups]
    if len(set(bases)) == 1:
        base = bases[0]
        return lambda step: base * factor(step)
    raise ValueError("scaled() needs one learning rate across parameter groups; pass lr_at per group instead")


def fit(optimizer, batches: Iterable, loss_of: Callable[[Any], Any], *, lr_at: Callable[[int], float] | None = None,
        clip: tuple[Iterable[torch.nn.Parameter], float] | None = None, backward: Callable | None = None,
        start: int = 0, steps: int | None = None,
        on_step: Callable[[int, torch.Tensor, Any], None] | None = None) -> list:
    """One optimiser step per batch of `batches` (at most `steps - start` of them), numbered from `start`.

    `loss_of(batch)` returns the loss, or (loss, record); the records (None without one) are returned, one per
    step. `backward` replaces `loss.backward()` (accelerate's `accelerator.backward`); `clip=(params, max_norm)`
    clips the gradient norm before the step; `on_step(step, loss, record)` runs after it (checkpoints, logging,
    evaluation). Gradients are cleared before each backward (set to None)."""
    params = None
    if clip is not None:
        params, max_norm = list(clip[0]), clip[1]
    if steps is not None:
        batches = itertools.islice(batches, max(0, steps - start))
    records: list = []
    for step, batch in zip(itertools.count(start), batches):
        if lr_at is not None:
            rate = lr_at(step)
            for group in optimizer.param_groups:
                group["lr"] = rate
        out = loss_of(batch)
        loss, record = out if isinstance(out, tuple) else (out, None)
        optimizer.zero_grad(set_to_none=True)
        if backward is None:
            loss.backward()
        else:
            backward(loss)
        if params is not None:
            torch.nn.utils.clip_grad_norm_(params, max_norm)
        optimizer.step()
        records.append(record)
        if on_step is not None:
            on_step(step, loss, record)
    return records
