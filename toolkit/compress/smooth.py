"""SmoothQuant-style smoothing (Xiao et al., ICML 2023, https://arxiv.org/abs/2211.10438; mit-han-lab/smoothquant,
and llm-compressor's SmoothQuantModifier): for the linears a pre-norm feeds (q/k/v, gate/up, a parallel block's
both), per input channel j

    s_j = max|X_j|^α / max|W_:,j|^(1−α)      (X: the norm's output over the calibration tokens; W: every linear
                                              reading that norm; clamped at 1e-5 as the official smooth_ln_fcs)

then the norm's effective scale (γ, Gemma's 1 + γ) and its bias are divided by s and each reading linear's column j
multiplied by s_j: the float model computes the same function while the activations' outlier channels shrink, which
is what per-token activation quantization needs. The layout (toolkit.models.view) says which norm feeds which
linears; the fold is refused (bad input) where it cannot be exact: routers or fused experts reading a norm, a group
reading the residual stream without a norm, a norm without a weight, or (checked on one calibration window) a norm
whose output feeds more than the linears found. Statistics come from the float model before the block pass, as the
paper calibrates them."""

from __future__ import annotations

import torch

from toolkit.core.errors import BadInputError


def smoothing_scales(act_max: torch.Tensor, weight_max: torch.Tensor, alpha: float) -> torch.Tensor:
    """s = max|X|^α / max|W|^(1−α) per channel (weight maxima and s clamped at 1e-5, as the official code)."""
    return (act_max.pow(alpha) / weight_max.clamp(min=1e-5).pow(1 - alpha)).clamp(min=1e-5)


def smooth_targets(view) -> dict[tuple[int, str], list]:
    """{(block index, norm path): the slots reading that norm's output}, or bad input where the fold is not exact."""
    targets: dict[tuple[int, str], list] = {}
    for index, block in enumerate(view.blocks):
        layout = view.layout(index)
        if layout.routers or layout.experts is not None:
            raise BadInputError(f"smooth: {view.model_type}'s routers and fused experts read the MLP's norm; folding "
                                "smoothing scales into them is not implemented", "drop the smooth stage")
        for group in layout.groups:
            if not group.reads_residual:
                continue
            if group.norm is None:
                raise BadInputError(f"smooth: {group.names[0]} reads the residual stream without a norm to fold the "
                                    f"scales into ({view.model_type})", "drop the smooth stage")
            if getattr(block.get_submodule(group.norm), "weight", None) is None:
                raise BadInputError(f"smooth: {group.norm} has no weight to fold the scales into "
                                    f"({view.model_type})", "drop the smooth stage")
            targets.setdefault((index, group.norm), []).extend(group.slots)
    if not targets:
        raise BadInputError(f"smooth: no linear of {view.model_type} reads a norm", "drop the smooth stage")
    return targets


@torch.no_grad()
def activation_maxima(view, windows: torch.Tensor, targets, device) -> dict[tuple[int, str], torch.Tensor]:
    """max|X_j| over every calibration token of each target norm's output (float32)."""
    from toolkit.nn.hooks import capture

    def running_max(seen, out):
        now = out.abs().reshape(-1, out.shape[-1]).amax(0).float()
        return now if seen is None else torch.maximum(seen, now)

    paths = {(index, path): f"{view.block_path(index)}.{path}" for index, path in targets}
    with capture(view.model, list(paths.values()), reduce=running_max) as maxima:
        for window in windows:
            view.model(window.unsqueeze(0).to(device))
    return {key: maxima[full] for key, full in paths.items()}


def fold_scales(block, norm_path: str, offset: float, slots: list, s: torch.Tensor) -> None:
    """Norm's effective scale (offset + γ) and bias ÷ s; each slot's input column j × s_j (float64, cast back)."""
    norm = block.get_submodule(norm_path)
    s64 = s.double().to(norm.weight.device)
    weight = norm.weight.data
    weight.copy_(((offset + weight.double()) / s64 - offset).to(weight.dtype))
    if getattr(norm, "bias", None) is not None:
        norm.bias.data.copy_((norm.bias.data.double() / s64).to(norm.bias.dtype))
    for slot in slots:
        w = slot.weight(block)
        w.copy_((w.double() * s64.to(w.device)).to(w.dtype))


@torch.no_grad()
def smooth_model(view, windows: torch.Tensor, alpha: float, device) -> dict[str, torch.Tensor]:
    """Smooth every norm → linears pair of the model in place; returns {full norm path: s}. Refused (bad input,
    see the module docstring) where the fold would change the float model's function."""
    targets = smooth_targets(view)
    maxima = activation_maxima(view, windows, targets, device)
    probe = windows[:1].to(device)
    before = view.model(probe).logits.float()
    scales = {}
    for (index, path), slots in targets.items():
        block = view.blocks[index]
        weight_max = torch.stack([slot.weight(block).abs().amax(0).float() for slot in slots]).amax(0)
        s = smoothing_scales(maxima[(index, path)].to(weight_max.device), weight_max, alpha)
        fold_scales(block, path, view.layout(index).norms[path].offset, slots, s)
        scales[f"{view.block_path(index)}.{path}"] = s.cpu()
    after = view.model(probe).logits.float()
    tolerance = 1e-3 if next(view.model.parameters()).dtype == torch.float32 else 5e-2
    change = ((after - before).abs().max() / before.abs().max().clamp(min=1e-12)).item()
    if change > tolerance:
        raise BadInputError(f"smooth: folding the scales changed {view.model_type}'s float output by {change:.2g} "
                            "(relative): a smoothed norm feeds more than the linears found", "drop the smooth stage")
    return scales
