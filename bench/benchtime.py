"""Timing helper shared by the benchmark scripts."""

from __future__ import annotations

import statistics
import time
from typing import Callable


def median_seconds(fn: Callable[[], object], runs: int, warm_up: bool = False,
                   clock: Callable[[], float] = time.perf_counter) -> float:
    """Median seconds of ``runs`` calls of ``fn``, after one untimed call if
    ``warm_up`` (JIT compile or numba cache load); wall seconds, or those of
    ``clock`` (``time.process_time``: the process's CPU seconds, less sensitive to
    a shared machine's load)."""
    if warm_up:
        fn()
    seconds = []
    for _ in range(runs):
        start = clock()
        fn()
        seconds.append(clock() - start)
    return statistics.median(seconds)


def command_env(tree: object, numba_cache_dir: object) -> dict[str, str]:
    """The environment of a timed ``replaysim`` process importing ``tree`` with its own numba cache.

    ``PYTHONDONTWRITEBYTECODE`` is dropped, so that a warm-up run writes the
    tree's ``__pycache__`` as an installed package has it; otherwise every
    timed process would compile the project's sources again.
    """
    import os

    env = dict(os.environ, PYTHONPATH=str(tree), NUMBA_CACHE_DIR=str(numba_cache_dir))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env
