"""Per-layer statistics with one decoder block in memory (`--set onload=true` of edit's key covariance, remove-ln
analyze and steer's direction estimators): the parts outside the blocks (embeddings, final norm, head) are loaded
once, the windows' hidden states are captured at block 0 (`capture_block_inputs`) and the kwargs the model gives
each block (masks, rotary embeddings: Gemma 2/3 pick them per block by layer type) recorded, then blocks 0..last are read
from the safetensors shards one at a time (toolkit/models/lazy.py), every group of windows runs through the block
(`BlockStep.run`) with the caller's hooks on it, and the block is freed.

The same windows, the same block calls and the same hooks as a resident forward, so the same statistics. Host memory:
the parts outside the blocks + one block + every window's hidden states (plus one group's outputs while a block runs)
+ what the caller accumulates. `stats_plan` says so in a --dry-run, from config.json alone; `inference_plan` is the
--dry-run note of a step that needs the whole model at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from torch import nn


@dataclass
class Inputs:
    """Hidden states entering the next block (CPU, one tensor per batch of windows), and the extra args/kwargs the
    model passes its blocks for them (masks, position embeddings), captured once."""

    hidden: list[torch.Tensor]
    args: tuple
    kwargs: dict
    window: torch.Tensor | None = None  # one window's token ids: for the kwargs the model passes each block
    per_block: list[dict] | None = None  # those kwargs, recorded when block 0 is loaded (Gemma 2/3: per layer type)


class BlockStream:
    """Blocks of a `LazyModel` streamed one at a time over groups of windows; the non-block parts stay loaded
    (the caller may use the final norm and head afterwards). `group` is the number of the group running through the
    current block, for hooks that record only some groups."""

    def __init__(self, lazy, device: str = "cpu", probe: Callable[[str], None] | None = None):
        self.lazy, self.device, self.probe = lazy, device, probe
        self.group: int | None = None
        lazy.load_non_block()
        if probe is not None:
            probe("non-block parts loaded")

    def windows(self, windows: torch.Tensor, batch: int = 1) -> Inputs:
        """Equal-length windows (n, T) of token ids, captured at block 0 and grouped `batch` per block call (as a
        resident forward over `batch` windows at a time)."""
        from toolkit.nn.capture import _to, capture_block_inputs

        hidden, args, kwargs = capture_block_inputs(self.lazy.model, windows, self.device, self.lazy.view)
        if batch > 1:
            hidden = [torch.cat(hidden[start:start + batch]) for start in range(0, len(hidden), batch)]
        return Inputs(hidden, _to(args, self.device), _to(kwargs, self.device), window=windows[0])

    def run(self, groups: list[Inputs], *, last: int | None = None,
            hooks: Callable[[int, nn.Module], list] | None = None,
            after: Callable[[int, list[Inputs]], None] | None = None,
            stop_inside_last: str | Callable[[int], str] | None = None, progress: Callable | None = None) -> None:
        """Blocks 0..last (default: all): block i is read, `hooks(i, block)` registers forward hooks (it returns
        their handles; they are removed after the block), every group runs through the block and its hidden states
        become the block's outputs, `after(i, groups)` reads them, and the block is freed. `stop_inside_last` (a
        module path inside the block, or a function of the block index giving one) ends the last block's calls after
        that module: its outputs are not needed. Each block's layout (lazy.view.layout) is discovered on its first
        input when it loads, so `hooks` may ask the view for its slots."""
        from toolkit.nn.capture import _to, per_block_kwargs
        from toolkit.nn.pipeline import BlockStep

        lazy = self.lazy
        last = len(lazy.layers) - 1 if last is None else last
        indices = range(last + 1)
        for index in (progress(indices, total=len(indices), description="blocks") if progress else indices):
            block = lazy.load_block(index).to(self.device)
            if self.probe is not None:
                self.probe(f"block {index} loaded")
            first = groups[0]
            layout = lazy.view.layout(index, (first.hidden[0].to(self.device), first.args, first.kwargs))
            for group in groups:  # once, at the first block: the kwargs the model gives each block
                if group.per_block is None and group.window is not None:
                    group.per_block = [_to(k, self.device) for k in per_block_kwargs(
                        lazy.model, lazy.view, group.window, self.device, group.kwargs, layout.returns_tuple)]
            handles = hooks(index, block) if hooks is not None else []
            stop = None
            if stop_inside_last and index == last:
                path = stop_inside_last(index) if callable(stop_inside_last) else stop_inside_last
                stop = block.get_submodule(path)
            try:
                for number, group in enumerate(groups):
                    self.group = number
                    kwargs = group.kwargs if group.per_block is None else group.per_block[index]
                    outputs = BlockStep(index=index, block=block, inputs=group.hidden, args=group.args,
                                        kwargs=kwargs, device=self.device).run(stop_after=stop)
                    if stop is None:
                        group.hidden = outputs
            finally:
                self.group = None
                for handle in handles:
                    handle.remove()
            if self.probe is not None:
                self.probe(f"block {index} done")
            if after is not None:
                after(index, groups)
            lazy.free_block(index)


def checkpoint_fingerprint(lazy, update: Callable[[object, str, torch.Tensor], None], digest,
                           device: str = "cpu") -> None:
    """Feed `update(digest, name, tensor)` every parameter of the model `lazy` builds, in named_parameters order
    (tied ones once), read from the shards one tensor at a time in the compute dtype and moved to `device` (where a
    resident model's reductions would run): the same tensors a resident load gives, without the model in memory."""
    keys = getattr(lazy.model, "_tied_weights_keys", None) or {}
    tied = set(lazy.tied) | (set(keys) if isinstance(keys, dict) and getattr(lazy.config, "tie_word_embeddings", False)
                                    else set())
    for name, _ in lazy.model.named_parameters():  # the skeleton is untied: a resident model lists these once
        if name not in tied:
            update(digest, name, lazy.read(name).to(device))


# -- --dry-run notes -------------------------------------------------------------------------------------------------

def check_onload_source(model: str) -> None:
    """--dry-run's check of onload=true: a source that is not a local safetensors directory is refused (one line,
    exit 2) as the run would refuse it; a zoo name is not built for a dry run (its run checks it)."""
    if not str(model).startswith("zoo:"):
        from toolkit.models.lazy import onload_source

        onload_source(model)


def _local_config(model: str) -> Path | None:
    path = Path(str(model)).expanduser()
    return path if (path / "config.json").is_file() else None


def stats_plan(model: str, *, onload: bool, windows: int, seqlen: int, blocks: int | None = None, batch: int = 1,
               statistics_bytes: int = 0, compute_dtype: torch.dtype = torch.float32) -> dict:
    """The memory of a statistics pass (from config.json alone, nothing read): with onload the parts outside the
    blocks + one block + every window's hidden states (in and out) + the statistics + one batch's workspace;
    without it the whole model + the statistics + the workspace. `blocks`: how many blocks the pass reads (default
    all)."""
    from toolkit.models.memory import MB, plan_memory

    path = _local_config(model)
    if path is None:
        return {"onload": onload, "mb": "not planned: --model is not a local directory with config.json"}
    memory = plan_memory(path, nsamples=windows, seqlen=seqlen, onload=True, compute_dtype=compute_dtype,
                         hessian_copies=0, weight_copies=0)
    width = torch.empty((), dtype=compute_dtype).element_size()
    size = memory["bytes"]
    if onload:
        parts = {"non_block_weights": size["resident_weights"], "block_weights": size["block_weights"],
                 "hidden_states": 2 * size["activations"]}
    else:
        parts = {"weights": memory["parameters"] * width}
    parts.update(statistics=statistics_bytes, workspace=size["workspace"] * batch)
    return {"onload": onload, "blocks": memory["blocks"], "blocks_read": blocks or memory["blocks"],
            "windows": windows, "seqlen": seqlen, "mb": {k: round(v / MB, 2) for k, v in parts.items()},
            "peak_mb": round(sum(parts.values()) / MB, 2)}


def inference_plan(model: str, why: str, compute_dtype: torch.dtype = torch.float32) -> dict:
    """--dry-run of a step that needs the whole model at once (generation, optimisation through many blocks): says
    so and why, with the weights' size from a local config.json (activations aside)."""
    from toolkit.models.memory import MB, plan_memory

    plan: dict = {"whole_model": True, "onload": f"not available: {why}"}
    path = _local_config(model)
    if path is None:
        plan["mb"] = "not planned: --model is not a local directory with config.json"
        return plan
    memory = plan_memory(path, nsamples=1, seqlen=1, onload=False, compute_dtype=compute_dtype, hessian_copies=0,
                         weight_copies=0)
    width = torch.empty((), dtype=compute_dtype).element_size()
    plan.update(parameters=memory["parameters"], mb={"weights": round(memory["parameters"] * width / MB, 2)})
    return plan
