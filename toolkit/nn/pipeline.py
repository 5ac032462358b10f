"""Sequential layer-by-layer pipeline: capture the first block's inputs, then per block
calibrate (hooks) -> apply (callback) -> propagate through the modified block. Activations live on CPU between
blocks, one block at a time on the device, and each finished block is checkpointed so `--resume` continues.

OBR, GPTQ, SparseGPT, Wanda and MEMIT/EAMET all run on this.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import torch
import torch.nn as nn

from toolkit.core.errors import BadInputError
from toolkit.core.records import write_json
from toolkit.nn.capture import _to, batchable, capture_block_inputs, per_block_kwargs
from toolkit.nn.distributed import dist_info, rank_windows
from toolkit.nn.hooks import StopForward, stop_forward

if TYPE_CHECKING:
    from toolkit.models.layout import BlockLayout, Group
    from toolkit.models.view import ModelView

log = logging.getLogger("iclrkit")


@dataclass
class BlockStep:
    """One block's turn: `inputs` are its per-window hidden states (CPU); `run()` replays them on the device."""

    index: int
    block: nn.Module
    inputs: list[torch.Tensor]
    args: tuple
    kwargs: dict
    device: str
    extra: dict[str, Any] = field(default_factory=dict)
    probe: Callable[[str], None] | None = None  # memory probe (onloaded pipeline), called after each run()
    # set by a callback that already ran the changed block over every window (run_batched with hooks that change
    # the block mid-forward): the pipeline then takes these as the next block's inputs instead of propagating again
    outputs: list[torch.Tensor] | None = None

    layout: BlockLayout | None = None  # the block's discovered groups (ModelView.layout), set by the pipeline
    # whether windows may go through the block as one batch (`batchable`: BLOOM's ALiBi bias is built per batch)
    batchable: bool = True

    def group_hessians(self, groups: list[Group], dtype=torch.float64, all_tokens: bool = False) -> list:
        """One calibration forward, stopped as soon as the last of `groups` has its input: a `Tap` per group (its
        `accumulators()` map each slot to its Hessian accumulator: one shared by a plain group's slots, one per
        expert for fused experts, from the tokens routed to it or every token with `all_tokens`). Groups are given
        in the block's call order (the layout's)."""
        from toolkit.nn.calibrate import Tap

        taps = [Tap(group, self.block, dtype, self.device, all_tokens) for group in groups]
        handles = [tap.module.register_forward_pre_hook(tap.hook(), with_kwargs=True) for tap in taps]
        handles.append(taps[-1].module.register_forward_pre_hook(_stop_pre_hook))  # after the taps' own hooks
        try:
            self._forward_all()
        finally:
            for handle in handles:
                handle.remove()
        if self.probe is not None:
            self.probe(f"block {self.index} calibrated")
        return taps

    def run(self, stop_after: nn.Module | None = None) -> list[torch.Tensor] | None:
        """Forward every window through the block (hooks the callback registered see each one); outputs on CPU.
        With `stop_after` (a module inside the block) each window stops once that module and its hooks have run
        and nothing is returned: calibrating a linear needs nothing computed after it."""
        if stop_after is None:
            outputs = self._forward_all()
            if self.probe is not None:
                self.probe(f"block {self.index} propagated")
            return outputs
        handle = stop_after.register_forward_hook(stop_forward)
        try:
            self._forward_all()
        finally:
            handle.remove()
        if self.probe is not None:
            self.probe(f"block {self.index} calibrated")
        return None

    def run_batched(self) -> list[torch.Tensor]:
        """Every window through the block as one batch, in one forward (hooks see all windows' inputs at once);
        outputs on CPU, one per window as `run()` gives them. Windows must share a length."""
        with torch.no_grad():
            out = self.block(torch.cat([hidden.to(self.device) for hidden in self.inputs]), *self.args,
                             **self.kwargs)
        out = (out[0] if isinstance(out, tuple) else out).cpu()
        if self.probe is not None:
            self.probe(f"block {self.index} calibrated and propagated in one batch")
        return list(out.split([hidden.shape[0] for hidden in self.inputs]))

    def calibrate_in_one_forward(self, groups: list[Group], on_group: Callable[[int, Any], None],
                                 dtype=torch.float64, all_tokens: bool = False) -> None:
        """True-sequential calibration in ONE forward: every window goes through the block as one batch
        (`run_batched`); when group g's input arrives at its anchor, a `Tap` of it goes to `on_group(g, tap)` before
        the group runs, so a callback that changes the group's weights makes the later groups see the changed
        earlier ones (groups sharing an anchor, a fused experts module's gate/up then down, are handled in order at
        that one call). The block's outputs are kept as the next block's inputs (`propagated`): no second forward."""
        from toolkit.nn.calibrate import Tap

        done: set[int] = set()
        anchors: dict[int, list[int]] = {}
        modules = {}
        for index, group in enumerate(groups):
            module = self.block.get_submodule(group.anchor)
            anchors.setdefault(id(module), []).append(index)
            modules[id(module)] = module

        def pre_hook(indices):
            def hook(module, args, kwargs):
                for index in indices:
                    if index in done:
                        continue
                    done.add(index)
                    tap = Tap(groups[index], self.block, dtype, None, all_tokens)
                    tap.add(args, kwargs)
                    on_group(index, tap)
            return hook

        handles = [modules[key].register_forward_pre_hook(pre_hook(indices), with_kwargs=True)
                   for key, indices in anchors.items()]
        try:
            self.outputs = self.run_batched()
        finally:
            for handle in handles:
                handle.remove()
        if len(done) != len(groups):
            raise RuntimeError(f"one-forward calibration reached {len(done)} of {len(groups)} linear groups")

    def propagated(self) -> list[torch.Tensor]:
        """The next block's inputs: the outputs a callback already computed, else one propagation forward."""
        return self.outputs if self.outputs is not None else self.run()

    def _forward_all(self) -> list[torch.Tensor]:
        outputs = []
        with torch.no_grad():
            for hidden in self.inputs:
                try:
                    out = self.block(hidden.to(self.device), *self.args, **self.kwargs)
                except StopForward:
                    continue
                outputs.append((out[0] if isinstance(out, tuple) else out).cpu())
        return outputs


def _stop_pre_hook(module, args) -> None:
    raise StopForward


def run_sequential(model: nn.Module, windows: torch.Tensor, on_block: Callable[[BlockStep], None], *,
                   device: str = "cpu", checkpoint_dir: Path | None = None, resume: bool = False,
                   fingerprint: str = "", progress: Callable | None = None, view: ModelView | None = None) -> None:
    """Call `on_block(step)` for each block in order; `on_block` registers hooks, calls `step.run()` to calibrate,
    and changes the block's weights. The pipeline then propagates the windows through the changed block.
    Under torch.distributed each rank propagates its share of the windows (`rank_windows`), as the onloaded
    pipeline does; `on_block` all-reduces what it accumulates and may share its solves out (`share_out`).

    With `checkpoint_dir`, block i's weights and the next block's inputs are saved after it is done; with
    `resume=True` finished blocks are restored instead of recomputed (the fingerprint must match).
    """
    from toolkit.models.view import view_of

    view = view or view_of(model)
    layers = view.blocks
    state = _load_progress(checkpoint_dir, fingerprint) if (resume and checkpoint_dir) else None
    inputs, args, kwargs = capture_block_inputs(model, rank_windows(windows), device, view)
    start = 0
    if state is not None:
        start = state["done"] + 1
        for index in range(start):
            layers[index].load_state_dict(_load_tensors(checkpoint_dir / f"block_{index}.safetensors"))
        inputs = list(_load_tensors(checkpoint_dir / "inputs.safetensors").values())
        log.warning("resuming after block %d of %d (its checkpoint in %s)", start - 1, len(layers), checkpoint_dir)
    args, kwargs = _to(args, device), _to(kwargs, device)
    indices = range(start, len(layers))
    together, block_kwargs = None, None
    for index in (progress(indices, total=len(indices), description="blocks") if progress else indices):
        block = layers[index]
        original_device = next(block.parameters()).device
        block.to(device)
        if block_kwargs is None:  # the first block's layout says how blocks return (for the kwargs recorders)
            returns_tuple = view.layout(index, (inputs[0].to(device), args, kwargs)).returns_tuple
            block_kwargs = [_to(k, device) for k in per_block_kwargs(model, view, windows[0], device, kwargs,
                                                                     returns_tuple)]
        kwargs = block_kwargs[index]
        if together is None:
            together = batchable(block, inputs, args, kwargs, device)
        step = BlockStep(index=index, block=block, inputs=inputs, args=args, kwargs=kwargs, device=device,
                         layout=view.layout(index, (inputs[0].to(device), args, kwargs)), batchable=together)
        on_block(step)
        inputs = step.propagated()
        block.to(original_device)
        if checkpoint_dir is not None:
            _save_progress(checkpoint_dir, index, block, inputs, fingerprint)


def _save_progress(directory: Path, index: int, block: nn.Module, inputs: list[torch.Tensor], fingerprint: str):
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().cpu().contiguous() for k, v in block.state_dict().items()},
              str(directory / f"block_{index}.safetensors"))
    save_file({f"{i:06d}": x.contiguous() for i, x in enumerate(inputs)}, str(directory / "inputs.tmp"))
    (directory / "inputs.tmp").replace(directory / "inputs.safetensors")
    write_json(directory / "progress.json", {"done": index, "fingerprint": fingerprint})


def _load_progress(directory: Path, fingerprint: str) -> dict | None:
    from toolkit.core.errors import reading_checkpoint

    path = directory / "progress.json"
    if not path.exists():
        return None
    with reading_checkpoint(path):
        state = json.loads(path.read_text())
        done = int(state["done"])
    if state.get("fingerprint") != fingerprint:
        raise BadInputError(f"checkpoints in {directory} belong to another run (model/config differ)",
                            "drop --resume to start afresh")
    _check_checkpoints(directory, done)
    log.warning("--resume: blocks 0..%d restored from %s; continuing at block %d", done, directory, done + 1)
    return state


def _check_checkpoints(directory: Path, done: int) -> None:
    """Every block file up to `done`, the saved inputs and any other *.safetensors there (a method's per-block
    scales) exist with a whole header, before anything is restored: a damaged one is named now, as bad input."""
    from toolkit.core.errors import RESUME_HINT
    from toolkit.models.source import safetensors_problem

    needed = [directory / f"block_{i}.safetensors" for i in range(done + 1)] + [directory / "inputs.safetensors"]
    for file in sorted({*needed, *directory.glob("*.safetensors")}):
        problem = "missing" if not file.is_file() else safetensors_problem(file)
        if problem is not None:
            raise BadInputError(f"corrupt checkpoint {file}: {problem}", RESUME_HINT)


def _load_tensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    from toolkit.core.errors import reading_checkpoint

    with reading_checkpoint(path):
        return load_file(str(path))


# -- onloaded pipeline: one block in memory at a time, read from the safetensors shards -----------------------------

def run_sequential_onloaded(lazy, windows: torch.Tensor, on_block: Callable[[BlockStep], None], *,
                            device: str = "cpu", out_dir: Path | None = None, save_dtype: torch.dtype | None = None,
                            max_shard_bytes: int = 2 * 10**9, progress: Callable | None = None,
                            probe: Callable[[str], None] | None = None,
                            on_done: Callable[[Any], None] | None = None) -> dict:
    """`run_sequential` for a `toolkit.models.lazy.LazyModel`: the parts outside the blocks are loaded once, then
    block i is read from the shards, calibrated → changed by `on_block` → propagated on `device`, written to the
    output shards under `out_dir` (its checkpoint names, in `save_dtype` or the compute dtype) and freed.

    Under torch.distributed each rank runs its share of the windows; `on_block` all-reduces its statistics and may
    share the solves out; rank 0 writes. `on_done(lazy)` runs after the last block, before the non-block tensors
    are written. Returns a summary (blocks, seconds per block, bytes written)."""
    from toolkit.core.timing import Stopwatch
    from toolkit.models.shards import ShardWriter

    rank, _ = dist_info()
    writer = None
    if out_dir is not None and rank == 0:
        writer = ShardWriter(out_dir, lazy.output_layout(save_dtype), max_shard_bytes)
    seconds, cpu_seconds = [], []  # wall, and this process's CPU time (robust to other jobs on the machine)
    try:
        lazy.load_non_block()
        if probe is not None:
            probe("non-block parts loaded")
        inputs, args, kwargs = capture_block_inputs(lazy.model, rank_windows(windows), device, lazy.view)
        call = [inputs, _to(args, device), _to(kwargs, device)]
        del inputs
        indices = range(len(lazy.layers))
        for index in (progress(indices, total=len(indices), description="blocks") if progress else indices):
            with Stopwatch() as watch:
                call[0] = _onloaded_block(lazy, index, call, on_block, device, probe, windows[0])
                if writer is not None:
                    writer.add(_cast(lazy.block_state(index), save_dtype))
                lazy.free_block(index)
            seconds.append(watch.seconds)
            cpu_seconds.append(watch.cpu_seconds)
        del call
        if on_done is not None:
            on_done(lazy)
        if writer is not None:
            writer.add(_cast(lazy.non_block_state(), save_dtype))
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    summary = {"blocks": len(lazy.layers), "seconds_per_block": seconds, "cpu_seconds_per_block": cpu_seconds}
    if writer is not None:
        summary["index"] = writer.close()
        summary["bytes_written"] = writer.total_bytes
    return summary


def _onloaded_block(lazy, index, call: list, on_block, device, probe, window) -> list[torch.Tensor]:
    """One onloaded block's turn: read it; once (block 0) record the kwargs the model passes each block and check
    that windows batch; probe its layout on its first window if it is a new kind of block, `on_block`, then its
    outputs (the next block's inputs). `call` = [inputs, args, block 0's kwargs, (batchable, per-block kwargs)]."""
    block = lazy.load_block(index).to(device)
    if probe is not None:
        probe(f"block {index} loaded")
    inputs, args, kwargs = call[:3]
    if len(call) == 3:  # block 0 is loaded: its layout says how blocks return (for the kwargs recorders)
        returns_tuple = lazy.view.layout(index, (inputs[0].to(device), args, kwargs)).returns_tuple
        call.append(batchable(block, inputs, args, kwargs, device))
        call.append([_to(k, device) for k in per_block_kwargs(lazy.model, lazy.view, window, device, kwargs,
                                                               returns_tuple)])
    kwargs = call[4][index]
    step = BlockStep(index=index, block=block, inputs=inputs, args=args, kwargs=kwargs, device=device, probe=probe,
                     layout=lazy.view.layout(index, (inputs[0].to(device), args, kwargs)), batchable=call[3])
    on_block(step)
    return step.propagated()


def _cast(tensors: dict[str, torch.Tensor], dtype: torch.dtype | None) -> dict[str, torch.Tensor]:
    if dtype is None:
        return tensors
    return {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in tensors.items()}
