"""What the layer pipelines capture before the first block: the hidden states entering it for each window and the
extra args/kwargs the model passes blocks (masks, position embeddings), and whether windows can go through a block
as one batch with them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.nn as nn

from toolkit.core.errors import BadInputError
from toolkit.nn.hooks import StopForward

if TYPE_CHECKING:
    from toolkit.models.view import ModelView


def batchable(block: nn.Module, inputs: list[torch.Tensor], args: tuple, kwargs: dict, device) -> bool:
    """Whether two windows through `block` as one batch give what each gives alone, with the args/kwargs captured for
    one window (masks and position tensors broadcast; BLOOM's ALiBi bias is built for one window and does not)."""
    if len(inputs) < 2 or inputs[0].shape != inputs[1].shape:
        return True
    pair = [hidden.to(device) for hidden in inputs[:2]]
    with torch.no_grad():
        try:
            both = block(torch.cat(pair), *args, **kwargs)
        except RuntimeError:
            return False
        alone = [block(hidden, *args, **kwargs) for hidden in pair]
    both = both[0] if isinstance(both, tuple) else both
    alone = torch.cat([a[0] if isinstance(a, tuple) else a for a in alone])
    return both.shape == alone.shape and torch.allclose(both, alone, rtol=1e-4, atol=1e-5)


def _to(value, device):
    if torch.is_tensor(value):
        return value.to(device)
    if isinstance(value, tuple):
        return tuple(_to(v, device) for v in value)
    if isinstance(value, list):
        return [_to(v, device) for v in value]
    if isinstance(value, dict):
        return {k: _to(v, device) for k, v in value.items()}
    return value


def capture_block_inputs(model: nn.Module, windows: torch.Tensor, device: str,
                         view: ModelView | None = None) -> tuple[list[torch.Tensor], tuple, dict]:
    """Hidden states entering block 0 for each window (CPU), plus the extra args/kwargs the model passes blocks
    (masks, position embeddings), captured once: windows share a length, so those are the same for all."""
    from toolkit.models.view import view_of

    layers = (view or view_of(model)).blocks
    inputs: list[torch.Tensor] = []
    captured: dict[str, Any] = {}

    def catcher(module, args, kwargs):
        inputs.append(args[0].detach().cpu())
        if not captured:
            captured["args"] = tuple(None if _is_cache(a) else a for a in args[1:])
            captured["kwargs"] = {k: (None if _is_cache(v) else v) for k, v in kwargs.items()}
        raise StopForward

    layers_device = {id(l): next(l.parameters()).device for l in layers}
    for module in _non_block_modules(model, layers):
        module.to(device)
    handle = layers[0].register_forward_pre_hook(catcher, with_kwargs=True)
    try:
        with torch.no_grad():
            for window in windows:
                try:
                    model(window.unsqueeze(0).to(device), use_cache=False)
                except StopForward:
                    pass
    finally:
        handle.remove()
    for layer in layers:
        layer.to(layers_device[id(layer)])
    if not inputs:
        raise BadInputError("no calibration windows to run")
    kwargs = dict(captured["kwargs"])
    kwargs["use_cache"] = False
    return inputs, captured["args"], kwargs


def _is_cache(value) -> bool:
    return type(value).__name__.endswith("Cache")


def _non_block_modules(model: nn.Module, layers: nn.ModuleList) -> list[nn.Module]:
    """Leaf-level modules outside the block list (embeddings, rotary, final norm, head)."""
    block_ids = {id(m) for m in layers.modules()}
    return [m for m in model.modules() if id(m) not in block_ids and not list(m.children())]


class _KwargsRecorder(nn.Module):
    """Stands in for block `index` in one forward: records the kwargs the model passes it, hands the hidden states
    on unchanged (the last one stops the forward before the head)."""

    def __init__(self, index: int, store: list, returns_tuple: bool, last: bool):
        super().__init__()
        self.index, self.store, self.returns_tuple, self.last = index, store, returns_tuple, last

    def forward(self, hidden_states, *args, **kwargs):
        self.store[self.index] = {k: (None if _is_cache(v) else v) for k, v in kwargs.items()}
        if self.last:
            raise StopForward
        return (hidden_states,) if self.returns_tuple else hidden_states


def per_block_kwargs(model: nn.Module, view: ModelView, window: torch.Tensor, device: str, kwargs: dict,
                     returns_tuple: bool) -> list[dict]:
    """The kwargs the model passes each block for one window (`kwargs`, block 0's from capture_block_inputs, for a
    block the forward never reaches). Models with per-layer attention types (Gemma 2/3: sliding or full, each with
    its own mask and RoPE base) pass block i `mapping[config.layer_types[i]]`: the blocks are swapped for recorders for one
    forward, so this costs no block computation (and works on a meta-device skeleton)."""
    layers = view.blocks
    store: list = [None] * len(layers)
    originals = list(layers)
    for index in range(len(layers)):
        layers[index] = _KwargsRecorder(index, store, returns_tuple, index == len(layers) - 1)
    try:
        with torch.no_grad():
            model(window.unsqueeze(0).to(device), use_cache=False)
    except StopForward:
        pass
    finally:
        for index, block in enumerate(originals):
            layers[index] = block
    # a block never reached (a model whose loop ends early) keeps block 0's
    return [kwargs if recorded is None else {**recorded, "use_cache": False} for recorded in store]
