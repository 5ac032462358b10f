"""Input statistics of a block's groups of slots (toolkit.models.view.Group), gathered by hooks on each group's anchor
module while the block runs as in inference.

A plain group (q/k/v; gate/up; a parallel block's shared input) has one input, so one Hessian shared by its slots.
A fused-experts group has one Hessian per expert, from exactly the tokens the router sends that expert (or every
token, `all_tokens`): the gate/up projection's input is those tokens' hidden states, the down projection's input is
act(gate)·up computed from them with the expert's current weights (toolkit.models.experts).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from toolkit.linalg.hessian import HessianAccumulator
from toolkit.models import experts as moe
from toolkit.models.layout import EXPERT_IN, Group, _first_tensor


class Tap:
    """One group's accumulators, filled by `hook` (a forward pre-hook with kwargs on the group's anchor)."""

    def __init__(self, group: Group, block: nn.Module, dtype: torch.dtype = torch.float64, device=None,
                 all_tokens: bool = False, experts: set[int] | None = None):
        self.group, self.block, self.dtype, self.device = group, block, dtype, device
        self.all_tokens = all_tokens
        self.only = experts  # fused experts: accumulate these experts only (None: all)
        self.module = block.get_submodule(group.anchor)
        self._shared: HessianAccumulator | None = None
        self._experts: dict[int, HessianAccumulator] = {}
        self.tokens: dict[str, int] = {s.name: 0 for s in group.slots}
        self.calls: list[tuple[torch.Tensor, torch.Tensor]] = []  # fused experts: (hidden, routing) per call

    def add(self, args: tuple, kwargs: dict) -> None:
        if not self.group.experts:
            x = _first_tensor(args, kwargs).detach()
            if self._shared is None:
                self._shared = HessianAccumulator(x.shape[-1], device=self.device or x.device, dtype=self.dtype)
            self._shared.add(x)
            rows = x.reshape(-1, x.shape[-1]).shape[0]
            for slot in self.group.slots:
                self.tokens[slot.name] += rows
            return
        hidden, index = _experts_args(args, kwargs)
        self.calls.append((hidden.detach(), index))
        count = self.module.gate_up_proj.shape[0]
        inputs = moe.gate_up_inputs(hidden.detach(), index, count, self.all_tokens)
        for slot in self.group.slots:
            if self.only is not None and slot.expert not in self.only:
                continue
            x = inputs[slot.expert]
            if slot.param != EXPERT_IN and x.shape[0]:
                with torch.no_grad():
                    x = moe.down_input(self.module, slot.expert, x)
            accumulator = self._experts.get(slot.expert)
            if accumulator is None:
                width = slot.shape(self.block)[1]
                accumulator = self._experts[slot.expert] = HessianAccumulator(
                    width, device=self.device or hidden.device, dtype=self.dtype)
            if x.shape[0]:
                accumulator.add(x)
            self.tokens[slot.name] += int(x.shape[0])

    def hook(self):
        def record(module, args, kwargs):
            self.add(args, kwargs)
        return record

    def accumulators(self) -> dict[str, HessianAccumulator]:
        """{slot name: accumulator}; a plain group's slots share one."""
        if not self.group.experts:
            if self._shared is None:
                raise RuntimeError(f"group {self.group.names} saw no input")
            return {slot.name: self._shared for slot in self.group.slots}
        return {slot.name: self._experts[slot.expert] for slot in self.group.slots if slot.expert in self._experts}

    def all_token_fallback(self, experts: set[int]) -> Tap:
        """A tap of `experts` on every token of the calls this tap saw (for experts the router starved)."""
        tap = Tap(self.group, self.block, self.dtype, self.device, all_tokens=True, experts=experts)
        for hidden, index in self.calls:
            tap.add((hidden, index), {})
        return tap


def _experts_args(args: tuple, kwargs: dict) -> tuple[torch.Tensor, torch.Tensor]:
    names = ("hidden_states", "top_k_index", "top_k_weights")
    values = list(args) + [kwargs[n] for n in names[len(args):] if n in kwargs]
    if len(values) < 2:
        raise RuntimeError("a fused experts module was called without its routing (top_k_index)")
    return values[0], values[1]
