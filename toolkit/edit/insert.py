"""Insertion: the layer-by-layer closed-form update that writes the optimised values into the edit layers.

MEMIT's closed form asks the edited projection for the residual change itself, which holds where its output adds
straight into the residual stream. Where a post-norm reads it first (Gemma 2/3, OLMo-2: the ModelView knows), the
target is the norm's pre-image of that change instead (`ModelView.output_shift`); asking the projection for the
residual change there overshoots by about scale / rms of its output (Gemma 3 270M: 216 % of δ).
"""

from __future__ import annotations

import logging

import torch

from toolkit.core.errors import RunError
from toolkit.edit.context import EditContext
from toolkit.edit.keys import block_outputs, compute_keys, prompt_rows, subject_states
from toolkit.edit.solve import closed_form_update

log = logging.getLogger("iclrkit.edit")


def insert(ectx: EditContext, requests, z: torch.Tensor, layers: list[int], covs: dict[int, torch.Tensor],
           lam: float) -> dict[int, float]:
    """Spread Z − H across the edit layers in order (MEMIT's closed form); returns ‖ΔW‖ per layer.

    Each layer reaches about kᵀ(λC + KKᵀ)⁻¹k of its share of the residual; kᵀC⁻¹k grows with the key width,
    so a λ tuned for a 7B model (d_ff 11-16k) inserts only part of δ into a small model (see insertion_reach)."""
    norms = {}
    for index, layer in enumerate(layers):
        keys = compute_keys(ectx, requests, [layer])[layer]
        current = block_outputs(ectx, requests, layers[-1])
        resid = _projection_target(ectx, requests, layer, (z - current) / (len(layers) - index))
        update = closed_form_update(keys.t(), resid.t(), covs[layer].to(ectx.device), lam)
        weight = ectx.view.weight(ectx.down(layer))  # (out, in) whatever the storage (GPT-2's Conv1D)
        if not torch.isfinite(update).all():
            raise RunError(f"MEMIT update of layer {layer} has NaN/Inf entries", "raise mom2_update_weight")
        ectx.view.set_weight(ectx.down(layer), (weight.double() + update).to(weight.dtype))
        norms[layer] = float(update.norm())
    return norms


def _projection_target(ectx: EditContext, requests, layer: int, shift: torch.Tensor) -> torch.Tensor:
    """The change of layer's down-projection output (at the subject's last token, bare prompt) that moves the
    residual stream by `shift`: `shift` itself unless a post-norm reads the projection's output."""
    view = ectx.view
    slot = view.mlp_out(layer, "MEMIT")
    if view.output_norm(layer, slot) is None:
        return shift
    rows = prompt_rows(ectx.tokenizer, requests, [""], with_target=False)
    output = subject_states(ectx, rows, [ectx.down(layer)], "output")[ectx.down(layer)]
    return view.output_shift(layer, slot, output, shift).to(shift.dtype)


def insertion_reach(reached: torch.Tensor, h: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """Share of each δ the edited weights produce at the z layer: the projection of (reached − h) on δ / ‖δ‖."""
    return ((reached - h) * delta).sum(-1) / delta.square().sum(-1).clamp_min(1e-12)
