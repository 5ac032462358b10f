"""`iclrkit segment mbunet train`: augmentation, the training loop and the run (masked / binary / fp32).
"""

from __future__ import annotations

import json

import torch
import torch.nn.functional as F

from toolkit.core.errors import RunError
from toolkit.nn.schedule import cosine_steps
from toolkit.segment.budget import (
    choose_mask_ratios,
    layer_bitops,
    probe_mask_gains,
    total_bitops,
    uniform_gains,
    zero_fractions,
)
from toolkit.segment.config import MBUNetTrainConfig
from toolkit.segment.mbunet import ARCH_FILE, WEIGHTS_FILE, UNet, iou_per_class, mean_iou, predict, save_model


def augment(images: torch.Tensor, masks: torch.Tensor, generator: torch.Generator):
    """Random horizontal and vertical flips (exact for masks)."""
    if torch.rand(1, generator=generator).item() < 0.5:
        images, masks = images.flip(-1), masks.flip(-1)
    if torch.rand(1, generator=generator).item() < 0.5:
        images, masks = images.flip(-2), masks.flip(-2)
    return images, masks


def distill_loss(logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Per-pixel KL(teacher || student) of the temperature-softened class distributions, times T^2 (Hinton)."""
    t = F.log_softmax(teacher_logits / temperature, 1)
    s = F.log_softmax(logits / temperature, 1)
    return (t.exp() * (t - s)).sum(1).mean() * temperature**2


def train_steps(model: UNet, images: torch.Tensor, masks: torch.Tensor, steps: int, batch_size: int, lr: float,
                seed: int, device: str = "cpu", progress=None, start: int = 0, total: int | None = None,
                optimizer: torch.optim.Optimizer | None = None, stage1_steps: int = 0, teacher: UNet | None = None,
                distill: float = 0.0, distill_temperature: float = 1.0) -> tuple[list[float], torch.optim.Optimizer]:
    """Adam with a cosine learning-rate schedule over `total` steps (this call runs steps start..start+steps).
    Steps before `stage1_steps` train binary weights with real activations (two-stage training); with a
    `teacher`, the loss is (1 - distill) CE + distill KD."""
    total = total or steps
    optimizer = optimizer or torch.optim.Adam(model.parameters(), lr=lr)
    generator = torch.Generator().manual_seed(seed + start)
    model.train()
    losses = []
    iterator = range(start, start + steps)
    for step in (progress(iterator, total=steps, description="train") if progress else iterator):
        for group in optimizer.param_groups:
            group["lr"] = lr * cosine_steps(step, total)
        idx = torch.randint(0, len(images), (min(batch_size, len(images)),), generator=generator)
        x, y = augment(images[idx], masks[idx], generator)
        if stage1_steps:
            model.set_binary_activations(step >= stage1_steps)
        logits = model(x.to(device))
        loss = F.cross_entropy(logits, y.to(device))
        if teacher is not None and distill > 0:
            with torch.no_grad():
                teacher_logits = teacher(x.to(device))
            loss = (1 - distill) * loss + distill * distill_loss(logits, teacher_logits, distill_temperature)
        if not torch.isfinite(loss):
            raise RunError(f"training diverged at step {step} (loss {loss.item()})", "lower lr")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    if stage1_steps:
        model.set_binary_activations(True)
    return losses, optimizer


# long: one training loop (the optimiser, its schedule, the best-checkpoint and --resume state are shared by every
# step); read top to bottom as the paper's recipe
def train(config: MBUNetTrainConfig, ctx) -> dict:
    from toolkit.segment.data import load_dataset, split

    data = load_dataset(config.data, config.size, config.num_classes, config.n_images, ctx.seed)
    train_set, val_set = split(data, config.val_fraction, ctx.seed)
    model = UNet(config.width, config.depth, data.num_classes, config.variant, config.mask_rule, config.shortcut,
                 config.learnable).to(ctx.device)
    costs = layer_bitops(model, config.size) if config.variant != "fp32" else {}
    progress = ctx.progress
    fit = {"batch_size": config.batch_size, "lr": config.lr, "seed": ctx.seed, "device": ctx.device,
           "progress": progress, "total": config.steps}
    teacher_miou = None
    if config.variant != "fp32":
        if config.distill > 0:
            if config.teacher:
                from toolkit.segment.mbunet import load_model

                teacher = load_model(config.teacher)[0].to(ctx.device)
            else:
                teacher = UNet(config.width, config.depth, data.num_classes, "fp32").to(ctx.device)
                train_steps(teacher, train_set.images, train_set.masks, config.steps, start=0, **fit)
            teacher.eval()
            teacher_miou = mean_iou(iou_per_class(predict(teacher, val_set.images, device=ctx.device),
                                                  val_set.masks, data.num_classes))
            fit.update(teacher=teacher, distill=config.distill, distill_temperature=config.distill_temperature)
        fit["stage1_steps"] = int(config.two_stage * config.steps)
    gains: dict = {}
    if config.variant == "masked":
        probing = config.mask_ratios is None and config.mask_search == "probe"
        if config.mask_ratios is not None:
            model.set_mask_ratios(config.mask_ratios)
        elif not probing:
            model.set_mask_ratios(choose_mask_ratios(uniform_gains(costs, config.mask_ratio), costs,
                                                     config.mask_budget))
        warm = int(config.steps * config.warmup_fraction) if probing else 0
        losses, optimizer = train_steps(model, train_set.images, train_set.masks, warm, start=0, **fit)
        if probing:
            probe = slice(0, config.probe_images)  # training images: the validation set stays unseen
            gains = probe_mask_gains(model, train_set.images[probe].to(ctx.device),
                                     train_set.masks[probe].to(ctx.device), config.mask_candidates)
            model.set_mask_ratios(choose_mask_ratios(gains, costs, config.mask_budget))
        more, _ = train_steps(model, train_set.images, train_set.masks, config.steps - warm, start=warm,
                              optimizer=optimizer, **fit)
        losses += more
    else:
        losses, _ = train_steps(model, train_set.images, train_set.masks, config.steps, start=0, **fit)
    per_class = iou_per_class(predict(model, val_set.images, device=ctx.device), val_set.masks, data.num_classes)
    model.cpu()
    save_model(model, ctx.out, {"class_names": data.names, "size": config.size})
    ctx.artifacts += [WEIGHTS_FILE, ARCH_FILE]
    binary_ops = sum(costs.values())
    metrics = {
        "variant": config.variant,
        "miou": mean_iou(per_class),
        "iou": {name: (None if v is None else 100 * v) for name, v in zip(data.names, per_class)},
        "loss_first": losses[0] if losses else None,
        "loss_last": sum(losses[-20:]) / max(1, len(losses[-20:])) if losses else None,
        "mask_rule": model.mask_rule,
        "mask_ratios": model.mask_ratios(),
        "zero_fraction": zero_fractions(model),
        "bitops_vs_binary": total_bitops(costs, model.mask_ratios()) / binary_ops if binary_ops else None,
        "train_images": len(train_set.images), "val_images": len(val_set.images),
        "levers": {"shortcut": config.shortcut, "learnable": config.learnable, "two_stage": config.two_stage,
                   "distill": config.distill, "teacher_miou": teacher_miou},
    }
    if config.variant == "masked":
        (ctx.path("mask_search.json")).write_text(json.dumps(
            {"search": "fixed" if config.mask_ratios is not None else config.mask_search,
             "gains": {k: {str(r): g for r, g in v.items()} for k, v in gains.items()}, "bitops": costs,
             "chosen": model.mask_ratios()}, indent=2))
    ctx.metrics.update(metrics)
    return metrics
