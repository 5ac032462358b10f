"""Forward-signature knowledge that differs between transformers releases and model classes (the architecture itself
is discovered by `toolkit.models.view.ModelView`)."""

from __future__ import annotations

import inspect

import torch.nn as nn


def cache_kwarg(model: nn.Module) -> str:
    """The forward's KV-cache argument: transformers 5.x names it `cache` (and ignores `past_key_values`), 4.x
    `past_key_values`; the model output carries it under the same name."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def takes_logits_to_keep(model: nn.Module) -> bool:
    """Whether the forward takes `logits_to_keep` (the LM head on the last positions only)."""
    try:
        return "logits_to_keep" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False
