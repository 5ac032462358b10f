"""Small real language models trained here: a byte-level BPE tokenizer and a short AdamW run on text."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from toolkit.data.text import split_text, tokenize
from toolkit.nn.schedule import cosine_steps, linear_warmup

log = logging.getLogger("iclrkit")
SPECIAL = "<|endoftext|>"


def train_tokenizer(text: str, vocab_size: int):
    """Byte-level BPE (GPT-2 style) trained on `text`, wrapped as a transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[SPECIAL], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(text.split("\n\n"), trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token=SPECIAL, eos_token=SPECIAL,
                                   unk_token=SPECIAL, pad_token=SPECIAL, model_max_length=1024)


@dataclass
class TrainSpec:
    steps: int
    seqlen: int
    batch: int
    lr: float
    warmup: int = 20
    eval_every: int = 100
    weight_decay: float = 0.1


def batches(ids: torch.Tensor, spec: TrainSpec, generator: torch.Generator):
    while True:
        starts = torch.randint(0, ids.numel() - spec.seqlen - 1, (spec.batch,), generator=generator)
        yield torch.stack([ids[s:s + spec.seqlen] for s in starts.tolist()])


@torch.no_grad()
def mean_loss(model, ids: torch.Tensor, seqlen: int, max_windows: int = 32) -> float:
    windows = [ids[i:i + seqlen] for i in range(0, ids.numel() - seqlen, seqlen)][:max_windows]
    if not windows:
        return float("nan")
    batch = torch.stack(windows)
    return model(batch, labels=batch).loss.item()


def optimise(model, batch_stream, spec: TrainSpec, on_step=None) -> float:
    """AdamW (betas 0.9/0.95), linear warm-up then cosine decay, gradient clipping at 1: `spec.steps` steps on the
    batches of `batch_stream`; `on_step(step, loss)` after each. Returns the last training loss."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.lr, betas=(0.9, 0.95),
                                  weight_decay=spec.weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: linear_warmup(s, spec.warmup) * cosine_steps(min(s, spec.steps), spec.steps))
    model.train()
    loss = torch.tensor(float("nan"))
    for step, batch in zip(range(spec.steps), batch_stream):
        loss = model(batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        if on_step is not None:
            on_step(step + 1, loss)
    model.eval()
    return float(loss.detach())


def train_causal_lm(model, tokenizer, text: str, spec: TrainSpec, seed: int = 0, quiet: bool = False) -> dict:
    """Train in place on 95% of `text`; return losses measured on the held-out 5%."""
    torch.manual_seed(seed)
    train_text, val_text = split_text(text, test_fraction=0.05, seed=seed)
    train_ids, val_ids = tokenize(tokenizer, train_text), tokenize(tokenizer, val_text)
    started = time.perf_counter()

    def report(step: int, loss: torch.Tensor) -> None:
        if not quiet and (step % spec.eval_every == 0 or step == spec.steps):
            model.eval()
            val = mean_loss(model, val_ids, spec.seqlen)
            model.train()
            log.warning("step %d/%d train loss %.3f val loss %.3f (%.0fs)", step, spec.steps, loss.item(), val,
                        time.perf_counter() - started)

    loss = optimise(model, batches(train_ids, spec, torch.Generator().manual_seed(seed)), spec, on_step=report)
    return {"train_loss": loss, "val_loss": mean_loss(model, val_ids, spec.seqlen),
            "train_tokens": spec.steps * spec.batch * spec.seqlen, "seconds": time.perf_counter() - started}
