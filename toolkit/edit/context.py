"""The one object every step of an edit shares (keys, values, insertion, covariance, templates).

Where the blocks, the MLP down-projections and the head live comes from the model's ModelView (toolkit.models):
nothing here re-derives a layer path.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable

from torch import nn

from toolkit.models.tokens import pad_id
from toolkit.models.view import ModelView, view_of


@dataclass
class EditContext:
    """The model being edited, its tokenizer and view, the device, rows per forward (`batch`), the context templates
    keys are averaged over ("" is the bare prompt) and the progress callback (None: silent)."""

    model: nn.Module
    tokenizer: Any
    view: ModelView
    device: Any
    batch: int = 64
    templates: list[str] = field(default_factory=lambda: [""])
    progress: Callable | None = None

    @classmethod
    def of(cls, model: nn.Module, tokenizer, device, **kwargs) -> EditContext:
        return cls(model=model, tokenizer=tokenizer, view=view_of(model), device=device, **kwargs)

    def with_templates(self, templates: list[str]) -> EditContext:
        return dataclasses.replace(self, templates=list(templates))

    def down(self, layer: int) -> str:
        """Path of block `layer`'s MLP down-projection (its input is the key, its weight is what MEMIT edits)."""
        return self.view.full_name(layer, self.view.mlp_out(layer, "MEMIT"))

    def block(self, layer: int) -> str:
        return self.view.block_path(layer)

    @property
    def n_layers(self) -> int:
        return len(self.view)

    @property
    def base(self) -> nn.Module:
        """The module that owns the block list (its forward runs the blocks and the final norm, without the head)."""
        return self.view.decoder

    @property
    def blocks_name(self) -> str:
        """The block list's attribute name on `base`."""
        return self.view.layers_path.rpartition(".")[2]

    @property
    def lm_head(self) -> nn.Module:
        return self.view.lm_head

    @property
    def pad(self) -> int:
        return pad_id(self.tokenizer)
