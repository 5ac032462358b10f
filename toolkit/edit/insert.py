"""Insertion: the layer-by-layer closed-form update that writes the optimised values into the edit layers.
"""

from __future__ import annotations

import logging

import torch

from toolkit.core.errors import RunError
from toolkit.edit.context import EditContext
from toolkit.edit.keys import block_outputs, compute_keys
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
        resid = (z - current) / (len(layers) - index)
        update = closed_form_update(keys.t(), resid.t(), covs[layer].to(ectx.device), lam)
        weight = ectx.view.weight(ectx.down(layer))  # (out, in) whatever the storage (GPT-2's Conv1D)
        if not torch.isfinite(update).all():
            raise RunError(f"MEMIT update of layer {layer} has NaN/Inf entries", "raise mom2_update_weight")
        ectx.view.set_weight(ectx.down(layer), (weight.double() + update).to(weight.dtype))
        norms[layer] = float(update.norm())
    return norms


def insertion_reach(reached: torch.Tensor, h: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """Share of each δ the edited weights produce at the z layer: the projection of (reached − h) on δ / ‖δ‖."""
    return ((reached - h) * delta).sum(-1) / delta.square().sum(-1).clamp_min(1e-12)
