"""DeepRAG training for Hugging Face causal LMs, through accelerate (one process on CPU, any launch on GPUs).

Stage I, imitation learning: SFT on the minimum-retrieval trajectories with the prompt and every retrieved
`Context:` line masked out of the loss (labels -100), so the model learns to decide and answer, not to write
passages (official filter-stage1/tokenize_sft.py). Stage II, chain of calibration: DPO on the retrieve-vs-
parametric decision at every step of those trajectories, against the frozen stage-I model as reference.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import torch
import torch.nn.functional as F

from toolkit.nn.logprobs import token_logprobs
from toolkit.nn.schedule import warmup_cosine
from toolkit.nn.train import epochs as epochs_of
from toolkit.nn.train import fit
from toolkit.rag.trace import CONTEXT, FOLLOW, INTERMEDIATE, SEARCH, Trace, render_context, render_final

IGNORE = -100


def trajectory_segments(prompt: str, trace: Trace) -> list[tuple[str, bool]]:
    """(text, trained?) pieces whose concatenation is prompt + trajectory; only retrieved context is untrained
    inside the trajectory."""
    segments = [(prompt, False)]
    for step in trace.steps:
        segments.append((f"{FOLLOW} {step.subquery}\n", True))
        if step.retrieves:
            segments += [(f"{SEARCH}\n", True), (render_context(step.retrieved) + "\n", False)]
        segments.append((f"{INTERMEDIATE} {step.answer}\n", True))
    segments.append((render_final(trace.final or "") + "\n", True))
    return segments


def encode_segments(tokenizer, segments: Sequence[tuple[str, bool]], max_length: int,
                    add_eos: bool = True) -> dict[str, list[int]]:
    """Token ids and labels; masked segments get -100. Truncated from the left so the trained tail survives."""
    ids, labels = [], []
    for text, trained in segments:
        piece = tokenizer(text, add_special_tokens=False)["input_ids"]
        ids += piece
        labels += piece if trained else [IGNORE] * len(piece)
    if add_eos and tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
        labels.append(tokenizer.eos_token_id)
    return {"input_ids": ids[-max_length:], "labels": labels[-max_length:]}


def context_token_spans(tokenizer, segments: Sequence[tuple[str, bool]]) -> list[range]:
    """Token index ranges of the `Context:` segments (for checking the mask)."""
    spans, position = [], 0
    for text, _ in segments:
        n = len(tokenizer(text, add_special_tokens=False)["input_ids"])
        if text.startswith(CONTEXT):
            spans.append(range(position, position + n))
        position += n
    return spans


def collate(examples: Sequence[dict], pad_id: int) -> dict[str, torch.Tensor]:
    width = max(len(e["input_ids"]) for e in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), width), IGNORE, dtype=torch.long)
    mask = torch.zeros((len(examples), width), dtype=torch.long)
    for row, example in enumerate(examples):
        n = len(example["input_ids"])
        ids[row, :n] = torch.tensor(example["input_ids"])
        labels[row, :n] = torch.tensor(example["labels"])
        mask[row, :n] = 1
    return {"input_ids": ids, "labels": labels, "attention_mask": mask}


def sequence_logprob(model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Sum of log p(label token) over the unmasked labels of each row."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1]
    targets = batch["labels"][:, 1:]
    keep = targets != IGNORE
    return (token_logprobs(logits, targets.clamp(min=0)) * keep).sum(-1)


def dpo_loss(policy_chosen: torch.Tensor, policy_rejected: torch.Tensor, ref_chosen: torch.Tensor,
             ref_rejected: torch.Tensor, beta: float) -> torch.Tensor:
    """-log σ(β[(log π(c) − log π_ref(c)) − (log π(r) − log π_ref(r))]), averaged (Rafailov et al. 2023)."""
    margin = (policy_chosen - ref_chosen) - (policy_rejected - ref_rejected)
    return -F.logsigmoid(beta * margin).mean()


def encode_pair(tokenizer, pair: dict, max_length: int) -> tuple[dict, dict]:
    """(chosen, rejected) encodings, only the response trained. A decision pair (format "decision") scores the
    decision text alone; an answer pair scores its line with the newline that ends it."""
    prompt = (pair["prompt"], False)
    end = "" if pair.get("format") == "decision" else "\n"
    return (encode_segments(tokenizer, [prompt, (pair["chosen"] + end, True)], max_length, add_eos=False),
            encode_segments(tokenizer, [prompt, (pair["rejected"] + end, True)], max_length, add_eos=False))


class BucketSampler(torch.utils.data.Sampler):
    """Batches of similar length (less padding): each epoch shuffles the examples, cuts them into windows of
    `batch_size * window` examples, sorts each window by length, cuts it into batches and shuffles the batches."""

    def __init__(self, lengths: list[int], batch_size: int, window: int, seed: int):
        self.lengths, self.batch_size, self.window, self.epoch, self.seed = lengths, batch_size, window, 0, seed

    def __iter__(self):
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        self.epoch += 1
        order = torch.randperm(len(self.lengths), generator=generator).tolist()
        span = self.batch_size * self.window
        batches = []
        for start in range(0, len(order), span):
            chunk = sorted(order[start:start + span], key=lambda i: self.lengths[i])
            batches += [chunk[i:i + self.batch_size] for i in range(0, len(chunk), self.batch_size)]
        return iter([batches[i] for i in torch.randperm(len(batches), generator=generator).tolist()])

    def __len__(self) -> int:
        span = self.batch_size * self.window
        return sum(math.ceil(min(span, len(self.lengths) - s) / self.batch_size)
                   for s in range(0, len(self.lengths), span))


def _loader(items: list, batch_size: int, seed: int, collate_fn: Callable, bucket: int = 0):
    if bucket:
        sampler = BucketSampler([len(item["input_ids"]) for item in items], batch_size, bucket, seed)
        return torch.utils.data.DataLoader(items, batch_sampler=sampler, collate_fn=collate_fn)
    generator = torch.Generator().manual_seed(seed)
    return torch.utils.data.DataLoader(items, batch_size=batch_size, shuffle=True, generator=generator,
                                       collate_fn=collate_fn)


def _optimise(model, loader, epochs: float, lr: float, warmup_ratio: float, cpu: bool, step_loss: Callable,
              on_step=None) -> list:
    """AdamW + warm-up/cosine through accelerate for ⌈epochs·len(loader)⌉ steps; `step_loss(model, batch)` returns
    (loss, record) and the records are returned, one per step."""
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=cpu)
    total = max(1, math.ceil(epochs * len(loader)))
    warmup = max(1, int(total * warmup_ratio))
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    model.train()
    records = fit(optimizer, epochs_of(loader), lambda batch: step_loss(model, batch), steps=total,
                  lr_at=lambda step: lr * warmup_cosine(step, total, warmup), backward=accelerator.backward,
                  on_step=(lambda step, loss, _: on_step(step + 1, total, float(loss))) if on_step else None)
    model.eval()
    return records


def train_sft(model, examples: list[dict], pad_id: int, epochs: float, lr: float, batch_size: int,
              warmup_ratio: float = 0.1, seed: int = 0, cpu: bool = True, on_step=None, bucket: int = 0) -> list[float]:
    """Next-token cross-entropy on unmasked labels; returns per-step losses. `bucket` > 0 batches examples of
    similar length (`BucketSampler` windows of bucket batches) to cut padding."""
    def step_loss(model, batch):
        loss = model(**batch).loss
        return loss, loss.item()

    loader = _loader(examples, batch_size, seed, lambda b: collate(b, pad_id), bucket)
    return _optimise(model, loader, epochs, lr, warmup_ratio, cpu, step_loss, on_step)


def train_dpo(model, reference, pairs: list[tuple[dict, dict]], pad_id: int, epochs: float, lr: float,
              batch_size: int, beta: float, warmup_ratio: float = 0.1, seed: int = 0, cpu: bool = True,
              on_step=None) -> list[dict]:
    """DPO over (chosen, rejected) encodings; reference log-probs are computed once, up front."""
    reference.eval()
    with torch.no_grad():
        ref = [(float(sequence_logprob(reference, collate([c], pad_id))),
                float(sequence_logprob(reference, collate([r], pad_id)))) for c, r in pairs]
    items = [(c, r, rc, rr) for (c, r), (rc, rr) in zip(pairs, ref)]

    def collate_pairs(batch):
        return (collate([b[0] for b in batch], pad_id), collate([b[1] for b in batch], pad_id),
                torch.tensor([b[2] for b in batch]), torch.tensor([b[3] for b in batch]))

    def step_loss(model, batch):
        chosen, rejected, ref_chosen, ref_rejected = batch
        policy_chosen, policy_rejected = sequence_logprob(model, chosen), sequence_logprob(model, rejected)
        ref_chosen, ref_rejected = ref_chosen.to(policy_chosen), ref_rejected.to(policy_chosen)
        loss = dpo_loss(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta)
        accuracy = float(((policy_chosen - ref_chosen) > (policy_rejected - ref_rejected)).float().mean())
        return loss, {"loss": loss.item(), "reward_accuracy": accuracy}

    loader = _loader(items, batch_size, seed, collate_pairs)
    return _optimise(model, loader, epochs, lr, warmup_ratio, cpu, step_loss, on_step)
