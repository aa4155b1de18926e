"""Timing helper shared by the benchmark scripts."""

from __future__ import annotations

import statistics
import time
from typing import Callable


def median_seconds(fn: Callable[[], object], runs: int, warm_up: bool = False) -> float:
    """Median wall seconds of ``runs`` calls of ``fn``, after one untimed call if
    ``warm_up`` (JIT compile or numba cache load)."""
    if warm_up:
        fn()
    seconds = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)
