"""Wall and CPU time of a stretch of code, as run records report them (`*_seconds`, `*_cpu_seconds`)."""

from __future__ import annotations

import time


class Stopwatch:
    """`with Stopwatch() as watch: ...` then `watch.seconds` (wall, perf_counter) and `watch.cpu_seconds` (this
    process's CPU time, every thread: comparable on a shared machine where wall time is not)."""

    def __enter__(self) -> "Stopwatch":
        self._wall, self._cpu = time.perf_counter(), time.process_time()
        self.seconds = self.cpu_seconds = 0.0
        return self

    def __exit__(self, *exc) -> None:
        self.seconds = time.perf_counter() - self._wall
        self.cpu_seconds = time.process_time() - self._cpu
