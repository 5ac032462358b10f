"""A bounded pool of calls whose results come back in input order: how every client of a server keeps several
requests in flight without changing what it computes."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterable, Iterator, TypeVar

T = TypeVar("T")
R = TypeVar("R")


def ordered_map(function: Callable[[T], R], items: Iterable[T], workers: int) -> Iterator[R]:
    """`function(item)` for every item, at most `workers` calls running at once, yielded in input order (each as
    soon as it and all before it are done, so a progress bar can follow). workers <= 1 runs them one after another
    in this thread. The first exception is raised in input order; calls not yet started are then cancelled."""
    items = list(items)
    if workers <= 1 or len(items) <= 1:
        for item in items:
            yield function(item)
        return
    pool = ThreadPoolExecutor(max_workers=min(workers, len(items)), thread_name_prefix="iclrkit-llm")
    try:
        futures = [pool.submit(function, item) for item in items]
        for future in futures:
            yield future.result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
