"""torch.distributed pieces of the layer pipeline: each rank's share of the calibration windows, and solves shared
out across ranks (job j on rank j mod world, results broadcast). Every function is the identity in one process."""

from __future__ import annotations

from typing import Any, Callable

import torch

from toolkit.core.errors import BadInputError


def dist_info() -> tuple[int, int]:
    """(rank, world size) of the default torch.distributed group, (0, 1) when not initialised."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def ranks_metric() -> dict:
    """{"ranks": N} under torch.distributed with N > 1 ranks (for a run's metrics), else {}."""
    world = dist_info()[1]
    return {"ranks": world} if world > 1 else {}


def rank_windows(windows: torch.Tensor) -> torch.Tensor:
    """This rank's share of the calibration windows (every world-th, starting at the rank)."""
    rank, world = dist_info()
    if world == 1:
        return windows
    if windows.shape[0] < world:
        raise BadInputError(f"{windows.shape[0]} calibration windows for {world} ranks: need at least one per rank")
    return windows[rank::world]


def shared_solves(jobs: list[tuple[Callable[[], torch.Tensor], torch.Tensor]]) -> list[torch.Tensor]:
    """Run job j on rank j mod world and broadcast its result (shaped/typed like the job's template tensor) to
    every rank; one process runs them all. The jobs must be the same list, in the same order, on every rank."""
    results = share_out([job for job, _ in jobs])
    return [result.to(template.device) for result, (_, template) in zip(results, jobs)]


def share_out(jobs: list[Callable[[], Any]]) -> list[Any]:
    """Run job j on rank j mod world, then broadcast every result to every rank; one process runs them all.

    A result is a tensor, None, a plain value, or a tuple/list of those; its tensors come back on the device they
    were computed on (the rank's own device under NCCL). The ranks first run all their own jobs, so N ranks solve
    N linears at once, then each result is broadcast from its owner. The jobs must be the same list, in the same
    order, on every rank."""
    rank, world = dist_info()
    if world == 1:
        return [job() for job in jobs]
    own = {j: job() for j, job in enumerate(jobs) if j % world == rank}
    return [_broadcast_result(own.get(j), src=j % world) for j in range(len(jobs))]


def _broadcast_result(value: Any, src: int) -> Any:
    """`value` of rank `src` on every rank: its structure (tensor shapes, dtypes, plain values) as one pickled
    object, then each tensor with a plain broadcast (on CPU for gloo, on this rank's CUDA device for NCCL)."""
    import torch.distributed as dist

    rank = dist.get_rank()
    gloo = dist.get_backend() == "gloo"
    box: list[Any] = [None]
    tensors: list[torch.Tensor] = []
    if rank == src:
        box[0] = _describe(value, tensors)
    dist.broadcast_object_list(box, src=src)
    device = torch.device("cpu") if gloo else torch.device("cuda", torch.cuda.current_device())
    if rank == src:
        buffers = [t.detach().contiguous().to(device) for t in tensors]
    else:
        buffers = [torch.empty(shape, dtype=dtype, device=device) for shape, dtype in _tensor_specs(box[0])]
    for buffer in buffers:
        dist.broadcast(buffer, src=src)
    if rank == src:
        return value
    return _rebuild(box[0], iter(buffers))


def _describe(value, tensors: list) -> Any:
    if torch.is_tensor(value):
        tensors.append(value)
        return ("tensor", tuple(value.shape), value.dtype)
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, [_describe(v, tensors) for v in value])
    return ("value", value)


def _tensor_specs(spec) -> list[tuple[tuple, torch.dtype]]:
    kind, *rest = spec
    if kind == "tensor":
        return [(rest[0], rest[1])]
    if kind in ("tuple", "list"):
        return [s for item in rest[0] for s in _tensor_specs(item)]
    return []


def _rebuild(spec, buffers) -> Any:
    kind, *rest = spec
    if kind == "tensor":
        return next(buffers)
    if kind in ("tuple", "list"):
        items = [_rebuild(item, buffers) for item in rest[0]]
        return tuple(items) if kind == "tuple" else items
    return rest[0]
