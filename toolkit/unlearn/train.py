"""The shared training loop (accelerate, seeded batches, checkpoints, --resume) and the model-side helpers."""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Protocol

import torch

from toolkit.core.errors import BadInputError, RunError
from toolkit.unlearn.config import UnlearnConfig
from toolkit.unlearn.data import batch_indices, collate, encode_documents, load_documents, pad_id
from toolkit.unlearn.losses import mean_nll, sequence_logprob

log = logging.getLogger("iclrkit")
STATE = "accelerate"


@dataclass
class Corpus:
    """Tokenised forget and retain windows on CPU."""

    forget: list[torch.Tensor]
    retain: list[torch.Tensor] = field(default_factory=list)
    pad: int = 0

    def batch(self, which: str, step: int, batch_size: int, seed: int, device) -> tuple[dict, list[int]]:
        """(padded batch on `device`, window indices) of step `step`; retain batches use their own shuffle."""
        chunks = self.forget if which == "forget" else self.retain
        picked = batch_indices(len(chunks), batch_size, step, seed + (0 if which == "forget" else 7919))
        return {k: v.to(device) for k, v in collate([chunks[i] for i in picked], self.pad).items()}, picked


def load_corpus(config: UnlearnConfig, tokenizer, need_retain: bool) -> Corpus:
    if need_retain and not config.retain:
        raise BadInputError("this method needs retain data", "pass --retain FILE")
    forget = encode_documents(tokenizer, load_documents(config.forget, config.max_documents), config.max_length)
    retain = encode_documents(tokenizer, load_documents(config.retain, config.max_documents),
                              config.max_length) if config.retain else []
    return Corpus(forget=forget, retain=retain, pad=pad_id(tokenizer))


def hidden_states(model, batch: dict[str, torch.Tensor], layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits, hidden state at `layer`): HF hidden_states indexing (0 = embeddings, L = output of block L).

    Read from output_hidden_states, not a block hook, so a block returning a tensor or a tuple (transformers 5 vs 4,
    technique note pitfall 5) does not matter."""
    out = model(**batch, output_hidden_states=True)
    if not 0 <= layer < len(out.hidden_states):
        raise BadInputError(f"layer {layer} out of range: the model has hidden states 0..{len(out.hidden_states) - 1}")
    return out.logits, out.hidden_states[layer]


def mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over non-pad tokens: the probe's feature both when it is trained and when it is applied (pitfall 3)."""
    weights = mask.to(hidden.dtype).unsqueeze(-1)
    return (hidden * weights).sum(1) / weights.sum(1).clamp(min=1.0)


@torch.no_grad()
def sequence_logprobs(model, corpus: Corpus, chunks: list[torch.Tensor], device, batch_size: int = 8) -> torch.Tensor:
    """log π(y|x) of every window under `model` (the frozen NPO reference when called before training)."""
    values = []
    for start in range(0, len(chunks), batch_size):
        batch = {k: v.to(device) for k, v in collate(chunks[start:start + batch_size], corpus.pad).items()}
        values.append(sequence_logprob(model(**batch).logits, batch["input_ids"], batch["attention_mask"]).cpu())
    return torch.cat(values)


@dataclass
class StepInputs:
    """What an objective sees at one step."""

    model: torch.nn.Module
    forget: dict[str, torch.Tensor]
    retain: Optional[dict[str, torch.Tensor]]
    forget_index: list[int]
    retain_index: list[int]
    step: int
    epoch: int
    epochs: int
    backward: Callable[[torch.Tensor], None]
    params: list[torch.nn.Parameter]


class Objective(Protocol):
    """One training step of an objective: leaves the gradients of its params in p.grad (through inputs.backward)
    and returns the step's scalar logs."""

    def __call__(self, inputs: StepInputs) -> dict[str, float]: ...


class UnlearnMethod(Protocol):
    """A registered unlearning objective (`@register("unlearn", NAME, config=..., ...)`,
    toolkit/unlearn/objectives/): from the config, the run context, the loaded model and the tokenised windows, its
    step, the tensors AdamW updates, and extra metrics (toolkit/unlearn/run.py run_unlearn calls exactly this)."""

    def __call__(self, config: Any, ctx: Any, model: torch.nn.Module,
                 corpus: Corpus) -> tuple[Objective, list[torch.nn.Parameter], dict]: ...


def total_steps(config: UnlearnConfig, n_forget: int) -> tuple[int, int]:
    per_epoch = max(1, math.ceil(n_forget / config.batch_size))
    total = per_epoch * config.epochs
    return (min(total, config.max_steps) if config.max_steps else total), per_epoch


def train(config: UnlearnConfig, ctx, model, corpus: Corpus, objective: Objective,
          params: list[torch.nn.Parameter], description: str) -> dict:
    """Run `objective` (which leaves gradients in p.grad) under accelerate with AdamW; checkpoint and resume.

    The model stays in eval mode (no dropout) so SAM's two forward passes see the same function."""
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=str(ctx.device) == "cpu")
    optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
    model, optimizer = accelerator.prepare(model, optimizer)
    model.eval()
    steps, per_epoch = total_steps(config, len(corpus.forget))
    start = _resume(accelerator, ctx)
    history: list[dict] = []
    for step in ctx.progress(range(start, steps), total=steps - start, description=description):
        epoch = step // per_epoch
        forget, forget_index = corpus.batch("forget", step, config.batch_size, ctx.seed, accelerator.device)
        retain, retain_index = corpus.batch("retain", step, config.batch_size, ctx.seed, accelerator.device) \
            if corpus.retain else (None, [])
        inputs = StepInputs(model=model, forget=forget, retain=retain, forget_index=forget_index,
                            retain_index=retain_index, step=step, epoch=epoch, epochs=config.epochs,
                            backward=accelerator.backward, params=params)
        optimizer.zero_grad(set_to_none=True)
        logs = objective(inputs)
        if not all(math.isfinite(v) for v in logs.values()):
            raise RunError(f"step {step}: non-finite loss {logs}", "lower --lr")
        norm = clip_gradients(accelerator, params, config.max_grad_norm)
        if norm is not None:
            if not math.isfinite(norm):
                raise RunError(f"step {step}: non-finite gradient norm {norm}", "lower --lr")
            logs = {**logs, "grad_norm": norm}
        optimizer.step()
        history.append({"step": step, **logs})
        if (step + 1) % config.checkpoint_every == 0 and step + 1 < steps and ctx.out is not None:
            _checkpoint(accelerator, ctx, step + 1)
    return {"steps": steps, "resumed_from": start, "steps_per_epoch": per_epoch,
            "model": accelerator.unwrap_model(model), "history": history}


def clip_gradients(accelerator, params: list[torch.nn.Parameter], max_norm: Optional[float]) -> Optional[float]:
    """Scale p.grad so the total L2 norm over `params` is at most `max_norm` (as HF Trainer does before each
    optimizer step); returns the norm before clipping, or None when clipping is off (max_norm 0 or None)."""
    if not max_norm:
        return None
    return float(accelerator.clip_grad_norm_([p for p in params if p.grad is not None], max_norm))


def _checkpoint(accelerator, ctx, next_step: int) -> None:
    accelerator.save_state(str(ctx.checkpoint_dir / STATE))
    (ctx.checkpoint_dir / "step.json").write_text(json.dumps({"next_step": next_step}))


def _resume(accelerator, ctx) -> int:
    if not ctx.resume or ctx.out is None or not (ctx.checkpoint_dir / "step.json").exists():
        return 0
    from toolkit.core.errors import reading_checkpoint

    with reading_checkpoint(ctx.checkpoint_dir / "step.json"):
        start = int(json.loads((ctx.checkpoint_dir / "step.json").read_text())["next_step"])
    with reading_checkpoint(ctx.checkpoint_dir / STATE):
        accelerator.load_state(str(ctx.checkpoint_dir / STATE))
    log.warning("--resume: training continues at step %d from %s", start, ctx.checkpoint_dir)
    return start


def finetune(model, chunks: list[torch.Tensor], pad: int, steps: int, lr: float, batch_size: int, seed: int,
             device, progress=None) -> list[float]:
    """Plain next-token fine-tuning (memorising the data, or the relearning attack); returns the step losses."""
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=str(device) == "cpu")
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    model, optimizer = accelerator.prepare(model, optimizer)
    model.eval()
    losses = []
    for step in (progress(range(steps), total=steps, description="fine-tune") if progress else range(steps)):
        picked = batch_indices(len(chunks), batch_size, step, seed)
        batch = {k: v.to(accelerator.device) for k, v in collate([chunks[i] for i in picked], pad).items()}
        optimizer.zero_grad(set_to_none=True)
        loss = mean_nll(model(**batch).logits, batch["input_ids"], batch["attention_mask"])
        accelerator.backward(loss)
        optimizer.step()
        losses.append(loss.item())
    return losses
