"""toolkit.core.timing.Stopwatch: wall and CPU seconds of a block (the `*_seconds` / `*_cpu_seconds` of run records)."""

import time

from toolkit.core.timing import Stopwatch


def test_stopwatch_counts_cpu_for_work_and_only_wall_for_sleep():
    with Stopwatch() as busy:
        end = time.process_time() + 0.05
        while time.process_time() < end:
            pass
    assert busy.cpu_seconds >= 0.05 and busy.seconds >= 0.04
    with Stopwatch() as idle:
        time.sleep(0.1)
    assert idle.seconds >= 0.1 and idle.cpu_seconds < 0.05
