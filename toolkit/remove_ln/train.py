"""`iclrkit remove-ln run`: fine-tune a GPT-2 while switching its LayerNorms off one by one, then export it LN-free.

Paper: "Transformers Don't Need LayerNorm at Inference Time" (Baroni, Khara, Schaeffer, Subkhankulov, Heimersheim),
https://arxiv.org/abs/2507.02559 — official code https://github.com/submarat/removing-layer-norm (config `gpt2`).
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import math
import os

import torch

from toolkit.core.errors import BadInputError, RunError
from toolkit.nn.schedule import warmup_cosine
from toolkit.remove_ln.config import RemoveLNConfig

log = logging.getLogger("iclrkit")
PAPER = "https://arxiv.org/abs/2507.02559"


def run_remove_ln(config: RemoveLNConfig, ctx) -> dict:
    from toolkit.models.source import load_model
    from toolkit.remove_ln.fakeln import check_supported, convert, measure_sigmas
    from toolkit.remove_ln.schedule import build_schedule

    _validate(config)
    original, tokenizer = load_model(config.model, ctx.device, torch.float32)
    check_supported(original)
    seqlen = config.seqlen or min(1024, original.config.n_positions)
    if seqlen > original.config.n_positions:
        raise BadInputError(f"seqlen {seqlen} exceeds the model's n_positions {original.config.n_positions}")
    events = build_schedule(original.config.n_layer, config.steps, config.start_fraction, config.end_fraction,
                            config.gaps)
    train_ids, eval_ids, eot_id = training_tokens(config, tokenizer)
    budget = config.steps * config.batch_size * config.grad_accum * seqlen
    if train_ids.numel() <= seqlen + 1:
        raise BadInputError(f"training text has {train_ids.numel()} tokens, fewer than one sequence of {seqlen}")
    ctx.inputs["model"] = config.model
    ctx.metrics.update(train_tokens=budget, data_tokens=int(train_ids.numel()), seqlen=seqlen,
                       schedule={e.name: e.step for e in events})
    ctx.metrics["ce_original"] = window_ce(original, eval_ids, seqlen, config.eval_windows, ctx.device)

    model = copy.deepcopy(original)
    handle = convert(model, eot_id, config.momentum, config.sigma_mode)
    generator = torch.Generator().manual_seed(ctx.seed + 1)
    measure_sigmas(handle, [random_batch(train_ids, config.batch_size, seqlen, generator).to(ctx.device)
                            for _ in range(config.calibration_batches)])
    ctx.metrics["ce_naive_removal"] = naive_ce(handle, eval_ids, seqlen, config, ctx.device)
    fingerprint = model_fingerprint(original, config)

    loss = train(model, train_ids, config, ctx, seqlen, fingerprint, "ln_free", handle=handle, events=events)
    if not handle.fully_removed():
        raise RunError("the schedule did not switch every LayerNorm off")
    ctx.metrics.update(final_train_loss=loss, sigmas=handle.sigmas())
    ctx.metrics["ce_fakeln"] = window_ce(model, eval_ids, seqlen, config.eval_windows, ctx.device)
    export_all(handle, tokenizer, eval_ids, seqlen, config, ctx)
    if config.vanilla_control:
        vanilla = copy.deepcopy(original)
        train(vanilla, train_ids, config, ctx, seqlen, fingerprint, "vanilla")
        ctx.baselines["ce_vanilla_ft"] = window_ce(vanilla, eval_ids, seqlen, config.eval_windows, ctx.device)
        ctx.metrics["ce_gap_vs_vanilla"] = ctx.metrics["ce_ln_free"] - ctx.baselines["ce_vanilla_ft"]
    ctx.baselines["ce_original"] = ctx.metrics["ce_original"]
    ctx.baselines["ce_naive_removal"] = ctx.metrics["ce_naive_removal"]
    return ctx.metrics


def _validate(config: RemoveLNConfig) -> None:
    positive = {"steps": config.steps, "batch_size": config.batch_size, "grad_accum": config.grad_accum,
                "checkpoint_every": config.checkpoint_every, "log_every": config.log_every,
                "calibration_batches": config.calibration_batches}
    for name, value in positive.items():
        if value < 1:
            raise BadInputError(f"{name} must be >= 1, got {value}")
    if config.seqlen is not None and config.seqlen < 2:
        raise BadInputError(f"seqlen must be >= 2, got {config.seqlen}")
    for name in ("lr", "min_lr", "weight_decay", "grad_clip"):
        value = getattr(config, name)
        if not (math.isfinite(value) and value >= 0):
            raise BadInputError(f"{name} must be a finite number >= 0, got {value}")
    if config.min_lr > config.lr:
        raise BadInputError(f"min_lr {config.min_lr} is above lr {config.lr}")
    if not 0 <= config.warmup_fraction < 1:
        raise BadInputError(f"warmup_fraction must be in [0, 1), got {config.warmup_fraction}")
    if not 0 <= config.momentum < 1:
        raise BadInputError(f"momentum must be in [0, 1), got {config.momentum}")
    if min(config.gaps) < 1:
        raise BadInputError(f"gaps must be positive, got {config.gaps}")
    if config.eval_windows is not None and config.eval_windows < 1:
        raise BadInputError(f"eval_windows must be >= 1, got {config.eval_windows}")


def training_tokens(config: RemoveLNConfig, tokenizer):
    """(train ids with EOT separators, eval ids as plain text, EOT id)."""
    from toolkit.data.text import load_text, split_text, tokenize

    text = load_text(config.data)
    if config.eval_data:
        eval_text = load_text(config.eval_data)
    else:
        text, eval_text = split_text(text, test_fraction=0.05, seed=0)
    eot_id = tokenizer.eos_token_id
    if config.eot_split != "none" and eot_id is None:
        raise BadInputError("the tokenizer has no end-of-text token", "use --set eot_split=none")
    pieces = {"none": [text], "line": text.splitlines(), "paragraph": text.split("\n\n")}[config.eot_split]
    pieces = [p for p in pieces if p.strip()]
    if not pieces:
        raise BadInputError("training text is empty")
    if config.eot_split == "none":
        ids = tokenize(tokenizer, text)
    else:
        ids = tokenize(tokenizer, tokenizer.eos_token.join(pieces) + tokenizer.eos_token)
    return ids, tokenize(tokenizer, eval_text), eot_id


def random_batch(ids: torch.Tensor, batch: int, seqlen: int, generator: torch.Generator) -> torch.Tensor:
    starts = torch.randint(0, ids.numel() - seqlen, (batch,), generator=generator)
    return torch.stack([ids[s:s + seqlen] for s in starts.tolist()])


@torch.no_grad()
def window_ce(model, ids: torch.Tensor, seqlen: int, max_windows: int | None, device: str, batch: int = 16) -> float:
    """Mean next-token cross-entropy (nats) over non-overlapping windows of seqlen tokens."""
    count = (ids.numel() - 1) // seqlen
    if count < 1:
        raise BadInputError(f"evaluation text has {ids.numel()} tokens, fewer than one window of {seqlen}")
    count = min(count, max_windows or count)
    windows = ids[:count * seqlen].view(count, seqlen)
    was_training = model.training
    model.eval()
    total, tokens = 0.0, 0
    for start in range(0, count, batch):
        chunk = windows[start:start + batch].to(device)
        logits = model(input_ids=chunk).logits[:, :-1].float()
        total += torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), chunk[:, 1:].reshape(-1),
                                                   reduction="sum").item()
        tokens += chunk[:, 1:].numel()
    model.train(was_training)
    value = total / tokens
    if not math.isfinite(value):
        raise RunError("cross-entropy is not finite: the model produced NaN/Inf logits")
    return value


def naive_ce(handle, eval_ids, seqlen, config, device) -> float:
    """CE with every LN switched to its measured σ at once, no fine-tuning (then the flags are restored)."""
    from toolkit.remove_ln.fakeln import remove_all

    remove_all(handle)
    try:
        return window_ce(handle.model, eval_ids, seqlen, config.eval_windows, device)
    finally:
        for fake in handle.all():
            fake.fake.fill_(False)
        handle.specials.keep_eot.fill_(True)
        handle.specials.keep_bos.fill_(True)


def model_fingerprint(model, config: RemoveLNConfig) -> dict:
    """Identifies the starting model (config + weights digest) and the training recipe, for --resume."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().float().cpu().flatten()[:4096].numpy().tobytes())
    arch = json.dumps(model.config.to_dict(), sort_keys=True, default=str)
    recipe = json.dumps(config.model_dump(mode="json", exclude={"checkpoint_every", "log_every", "eval_windows",
                                                                "export"}), sort_keys=True)
    return {"model": hashlib.sha256(arch.encode()).hexdigest() + digest.hexdigest(),
            "recipe": hashlib.sha256(recipe.encode()).hexdigest()}


def lr_factor(step: int, config: RemoveLNConfig) -> float:
    """cosine_with_min_lr (HF): linear warmup, then cosine from lr down to min_lr; returned as a factor of lr."""
    floor = config.min_lr / config.lr if config.lr > 0 else 0.0
    return warmup_cosine(step, config.steps, round(config.warmup_fraction * config.steps), floor)


def train(model, train_ids, config: RemoveLNConfig, ctx, seqlen: int, fingerprint: dict, phase: str,
          handle=None, events=None) -> float:
    """AdamW fine-tuning; with `handle`, the schedule switches LNs off. Runs under `accelerate launch` too."""
    from toolkit.remove_ln.schedule import apply_schedule

    runner = _Accelerated(ctx.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, config))
    generator = torch.Generator().manual_seed(ctx.seed + 1000 + runner.rank)  # same tokens in both phases
    start = _resume(model, optimizer, scheduler, generator, ctx, phase, fingerprint)
    wrapped, optimizer = runner.prepare(model, optimizer)
    wrapped.train()
    loss_value = float("nan")
    for step in ctx.progress(range(start, config.steps), total=config.steps - start, description=phase):
        if handle is not None:
            for event in apply_schedule(handle, events, step):
                if event.step == step:
                    log.info("step %d: %s switched off", step, event.name)
        loss_value = _step(wrapped, optimizer, runner, train_ids, config, seqlen, generator)
        scheduler.step()
        if not math.isfinite(loss_value):
            raise RunError(f"{phase}: loss became {loss_value} at step {step}", "lower --set lr or widen the gaps")
        if (step + 1) % config.log_every == 0:
            log.info("%s step %d/%d loss %.4f lr %.2e", phase, step + 1, config.steps, loss_value,
                     scheduler.get_last_lr()[0])
        if ((step + 1) % config.checkpoint_every == 0 or step + 1 == config.steps) and runner.is_main:
            _save(model, optimizer, scheduler, generator, ctx, phase, fingerprint, step + 1)
    if handle is not None:
        apply_schedule(handle, events, config.steps)
    model.eval()
    ctx.metrics[f"{phase}_final_loss"] = loss_value
    return loss_value


def _step(model, optimizer, runner, train_ids, config, seqlen, generator) -> float:
    total = 0.0
    for _ in range(config.grad_accum):
        batch = random_batch(train_ids, config.batch_size, seqlen, generator).to(runner.device)
        loss = model(input_ids=batch, labels=batch).loss / config.grad_accum
        runner.backward(loss)
        total += loss.item()
    runner.clip(model.parameters(), config.grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total


class _Accelerated:
    """Plain torch on ctx.device; under `accelerate launch` (WORLD_SIZE > 1) Accelerate's DDP wrapping."""

    def __init__(self, device: str):
        self.accelerator = None
        self.device, self.rank, self.is_main = device, 0, True
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            from accelerate import Accelerator

            self.accelerator = Accelerator(cpu=device == "cpu")
            self.device = str(self.accelerator.device)
            self.rank, self.is_main = self.accelerator.process_index, self.accelerator.is_main_process

    def prepare(self, model, optimizer):
        if self.accelerator is None:
            return model, optimizer
        return self.accelerator.prepare(model, optimizer)

    def backward(self, loss) -> None:
        loss.backward() if self.accelerator is None else self.accelerator.backward(loss)

    def clip(self, parameters, max_norm: float) -> None:
        if max_norm > 0:
            (torch.nn.utils.clip_grad_norm_ if self.accelerator is None else self.accelerator.clip_grad_norm_)(
                parameters, max_norm)


def _checkpoint_path(ctx, phase: str):
    return ctx.checkpoint_dir / f"{phase}.pt"


def _save(model, optimizer, scheduler, generator, ctx, phase, fingerprint, step) -> None:
    path = _checkpoint_path(ctx, phase)
    torch.save({"fingerprint": fingerprint, "step": step, "model": model.state_dict(),
                "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                "generator": generator.get_state(), "torch_rng": torch.get_rng_state()},  # dropout draws from it
               path.with_suffix(".tmp"))
    os.replace(path.with_suffix(".tmp"), path)


def _resume(model, optimizer, scheduler, generator, ctx, phase, fingerprint) -> int:
    """Step to start from: 0, or the checkpoint's step when --resume finds one made for this model and recipe."""
    if not ctx.resume:
        return 0
    path = _checkpoint_path(ctx, phase)
    if not path.is_file():
        return 0
    from toolkit.core.errors import reading_checkpoint

    with reading_checkpoint(path):
        state = torch.load(path, map_location="cpu", weights_only=True)
        made_for = state["fingerprint"]["model"], state["fingerprint"]["recipe"]
    if made_for[0] != fingerprint["model"]:
        raise BadInputError(f"checkpoint {path} was made for another model; refusing to resume",
                            "rerun without --resume (or with the model it was made for)")
    if made_for[1] != fingerprint["recipe"]:
        raise BadInputError(f"checkpoint {path} was made with different training settings; refusing to resume")
    with reading_checkpoint(path):
        for key in ("step", "model", "optimizer", "scheduler", "generator"):
            state[key]  # a checkpoint without one of them is as corrupt as a truncated one
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    generator.set_state(state["generator"])
    if "torch_rng" in state:  # so dropout draws what the uninterrupted run drew: --resume is bit-identical
        torch.set_rng_state(state["torch_rng"])
    log.warning("%s: resumed at step %d from %s", phase, state["step"], path)
    return state["step"]


def export_all(handle, tokenizer, eval_ids, seqlen, config: RemoveLNConfig, ctx) -> None:
    """Write the chosen export form(s), reload each from disk, and compare its logits with the FakeLN model."""
    from transformers import GPT2LMHeadModel

    from toolkit.models.save import save_model
    from toolkit.remove_ln import export as ex

    probe = eval_ids[:min(eval_ids.numel() // seqlen, 4) * seqlen].view(-1, seqlen).to(ctx.device)
    with torch.no_grad():
        reference = handle.model(input_ids=probe).logits
    metadata = {"technique": "remove-ln", "paper": PAPER, "source": config.model, "sigmas": handle.sigmas(),
                "eps": ex.PLAIN_EPS}
    diffs = {}
    if config.export in ("plain", "both"):
        save_model(ex.to_plain(handle), tokenizer, ctx.path("model"), technique="remove-ln", source=config.model,
                   paper=PAPER, notes=PLAIN_NOTES, metadata={**metadata, "form": "plain"})
        reloaded = GPT2LMHeadModel.from_pretrained(str(ctx.path("model")), dtype=torch.float32).to(ctx.device)
        diffs["plain"] = _max_diff(reloaded, probe, reference)
        ctx.metrics["ce_ln_free"] = window_ce(reloaded, eval_ids, seqlen, config.eval_windows, ctx.device)
    if config.export in ("folded", "both"):
        folded = ex.to_folded(handle)
        ex.save_folded(folded, tokenizer, ctx.path("model-folded"), {**metadata, "form": "folded"}, FOLDED_CARD)
        reloaded = ex.load_folded(ctx.path("model-folded"), ctx.device)
        diffs["folded"] = _max_diff(reloaded, probe, reference)
        if "ce_ln_free" not in ctx.metrics:
            ctx.metrics["ce_ln_free"] = window_ce(reloaded, eval_ids, seqlen, config.eval_windows, ctx.device)
    ctx.metrics["export_max_abs_logit_diff"] = max(diffs.values())
    ctx.metrics["export_diffs"] = diffs


@torch.no_grad()
def _max_diff(model, probe, reference) -> float:
    return (model(input_ids=probe).logits - reference).abs().max().item()


PLAIN_NOTES = ("LN-free GPT-2 (plain form): every LayerNorm has weight γ·√ε/σ and ε = 1e12, so it computes the "
               "affine map (x − mean)·γ/σ + β — numerically LN-free, loadable by vanilla GPT2LMHeadModel.")
FOLDED_CARD = """---
library_name: iclrkit
tags: [iclrkit, remove-ln]
---
# LN-free GPT-2 (folded form)

Every LayerNorm is the identity; its centering, 1/σ, γ and β are folded into the next linear (c_attn, c_fc) and into
an untied, biased unembedding. Load with `toolkit.remove_ln.export.load_folded(path)`; the weights file is named
`ln_free_folded.safetensors` on purpose so vanilla `from_pretrained` refuses it instead of re-adding LayerNorms.

- Paper: https://arxiv.org/abs/2507.02559
"""
