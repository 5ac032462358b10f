"""Multi-process launches (torchrun / `accelerate launch`): which techniques share their work across ranks, each
rank's device, and the process group the runner opens for techniques that use torch.distributed themselves."""

from __future__ import annotations

import contextlib
import os

# Techniques whose run() shares work across the ranks of a torchrun / `accelerate launch` job (accelerate DDP);
# every other technique runs on rank 0 only and ranks > 0 exit 2 saying so.
MULTI_RANK = ("remove-ln", "unlearn.", "rag.deeprag.train", "compress.")
SINGLE_RANK_EXCEPTIONS = ("remove-ln.analyze", "unlearn.eval", "compress.bench")
# Multi-rank techniques whose run() uses torch.distributed itself (compress: calibration windows split across
# ranks, Hessians all-reduced, solves shared out, rank 0 writes): the runner opens the default process group (gloo
# on CPU, NCCL on CUDA) around run() and gives ranks > 0 no output directory at all.
PROCESS_GROUP = ("compress.",)


def process_rank() -> int:
    """Rank under torchrun / `accelerate launch` (0 for a plain run)."""
    return int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")) or 0)


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1") or 1)


def supports_ranks(technique: str) -> bool:
    if technique in SINGLE_RANK_EXCEPTIONS:
        return False
    return any(technique == name or (name.endswith(".") and technique.startswith(name)) for name in MULTI_RANK)


def rank_device(device: str) -> str:
    """Under a multi-process launch every rank takes its own GPU: `cuda` (or auto -> cuda) becomes cuda:LOCAL_RANK."""
    if world_size() > 1 and device == "cuda":
        return f"cuda:{int(os.environ.get('LOCAL_RANK', '0') or 0)}"
    return device


def check_ranks(technique: str, multi_rank: bool | None) -> None:
    """A technique that cannot share its work across ranks refuses ranks > 0 instead of repeating the whole job."""
    from toolkit.core.errors import BadInputError

    world = world_size()
    if world <= 1 or (supports_ranks(technique) if multi_rank is None else multi_rank):
        return
    if process_rank() > 0:
        raise BadInputError(f"{technique} runs in one process; rank {process_rank()} of {world} exits",
                            "launch it without torchrun/accelerate (only rank 0 does the work)")
    import logging

    logging.getLogger("iclrkit").warning("%s runs in one process: rank 0 does the whole job, the other %d rank(s) "
                                         "exit", technique, world - 1)


def owns_process_group(technique: str) -> bool:
    return supports_ranks(technique) and any(technique.startswith(name) for name in PROCESS_GROUP)


@contextlib.contextmanager
def process_group(technique: str, device: str):
    """The default torch.distributed group for a PROCESS_GROUP technique under a multi-process launch (torchrun's
    env:// rendezvous): NCCL when the rank runs on CUDA (its own GPU, cuda:LOCAL_RANK), gloo on CPU. Nothing in one
    process, or when a group already exists."""
    if world_size() <= 1 or not owns_process_group(technique):
        yield
        return
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        yield
        return
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.set_device(torch.device(device))
    dist.init_process_group("nccl" if cuda else "gloo")
    try:
        yield
    finally:
        dist.destroy_process_group()
