"""What a first run compiles, while it compiles: kernels done, the kernel at work, and the time left.

numba announces each compilation (one kernel for one signature) with a
``numba:compile`` event; they nest, because a kernel's callees compile while
the kernel is typed.  A cold run of given code and configuration compiles its
kernels in the same order every time, so a timeline recorded on a cold run
(``python bench/bench_compile.py --write-timeline``: each compilation's kernel
in finishing order, with the CPU seconds of compiling up to its end) says how
far a run is: when the run finishes the compilation that the timeline has at
``cum_s``, the share done is ``cum_s / total_s``, and this machine's pace is
the wall time elapsed over ``cum_s``.  The time left is the timeline's
remainder at that pace; before the first known compilation, at the
timeline's own pace.  A kernel the timeline does not have (a changed kernel, or
a feature the timeline's case does not use) counts as done but moves no estimate.

The timelines ship in ``runners/compile_timeline.json``, one per case of
``bench/bench_compile.py``; :func:`timeline_case` picks the case nearest a
configuration.
"""

from __future__ import annotations

import json
import threading
import time
from importlib import resources

from numba.core import event

from simcore.config import SimConfig

TIMELINE_FILE = "compile_timeline.json"


def timeline_case(cfg: SimConfig) -> str:
    """The ``bench/bench_compile.py`` case whose kernels are nearest ``cfg``'s.

    Parameters
    ----------
    cfg : SimConfig
        The run's configuration.

    Returns
    -------
    str
        ``pd``, ``prefix`` or the policy's name where the shipped timelines
        have that case, else ``default``.
    """
    cases = _timelines()
    if cfg.engine.mode == "disaggregated":
        case = "pd"
    elif cfg.engine.aggregated.prefix_caching:
        case = "prefix"
    else:
        case = cfg.engine.policy
    return case if case in cases else "default"


def _timelines() -> dict:
    try:
        text = resources.files("runners").joinpath(TIMELINE_FILE).read_text(encoding="utf-8")
        return json.loads(text)["cases"]
    except (OSError, KeyError, ValueError, TypeError):
        return {}


def load_timeline(case: str) -> list[tuple[str, float]]:
    """The shipped timeline of ``case``: ``(kernel, cumulative CPU s)`` in finishing order ([] if none).

    Parameters
    ----------
    case : str
        A case of ``bench/bench_compile.py`` (:func:`timeline_case`).

    Returns
    -------
    list of (str, float)
    """
    try:
        return [(name, float(cum)) for name, cum in _timelines()[case]["compiles"]]
    except (KeyError, ValueError, TypeError):
        return []


def _kernel_name(dispatcher) -> str:
    func = dispatcher.py_func
    return f"{func.__module__}.{func.__qualname__}"


class CompileWatch:
    """Counts numba's compilations while open and estimates the time left from a timeline.

    Parameters
    ----------
    timeline : list of (str, float)
        ``(kernel, cumulative CPU s)`` of a cold run in finishing order
        (:func:`load_timeline`); empty: counts only.
    clock : callable, optional
        Wall clock in seconds (tests pass their own).
    """

    def __init__(self, timeline: list[tuple[str, float]], clock=time.monotonic) -> None:
        self.timeline = timeline
        self.total_s = timeline[-1][1] if timeline else 0.0
        self.clock = clock
        self.start = clock()
        self.done = 0  # compilations finished
        self.matched = 0  # timeline entries passed
        self.reference_s = 0.0  # the timeline's time at the last matched compilation
        self.matched_at: float | None = None  # wall time of that match
        self.active: list[str] = []  # the compilations under way, outermost first
        self._lock = threading.Lock()
        self._listener: event.Listener | None = None

    def finished(self, kernel: str) -> None:
        """Record that ``kernel`` finished compiling (one signature)."""
        with self._lock:
            self.done += 1
            for index in range(self.matched, len(self.timeline)):
                if self.timeline[index][0] == kernel:
                    self.matched = index + 1
                    self.reference_s = self.timeline[index][1]
                    self.matched_at = self.clock()
                    break

    def remaining_s(self) -> float | None:
        """Estimated wall seconds of compiling left (None without a timeline)."""
        with self._lock:
            if not self.timeline:
                return None
            if self.matched_at is None or self.reference_s <= 0.0:
                return max(0.0, self.total_s - (self.clock() - self.start))
            pace = (self.matched_at - self.start) / self.reference_s
            since = self.clock() - self.matched_at  # already spent on what follows the match
            return max(0.0, (self.total_s - self.reference_s) * pace - since)

    def describe(self) -> str:
        """One status phrase: ``compiling kernels 37/~334 (_replay_nb), ~6 min 20 s left``."""
        expected = f"/~{len(self.timeline)}" if self.timeline else ""
        with self._lock:
            current = self.active[-1].rsplit(".", 1)[-1] if self.active else ""
            done = self.done
        left = self.remaining_s()
        text = f"compiling kernels {done}{expected}"
        if current:
            text += f" ({current})"
        if left is not None:
            text += f", ~{_duration(left)} left"
        return text

    def __enter__(self) -> "CompileWatch":
        watch = self

        class Listener(event.Listener):
            def on_start(self, ev):
                with watch._lock:
                    watch.active.append(_kernel_name(ev.data["dispatcher"]))

            def on_end(self, ev):
                with watch._lock:
                    if watch.active:
                        watch.active.pop()
                watch.finished(_kernel_name(ev.data["dispatcher"]))

        self._listener = Listener()
        event.register("numba:compile", self._listener)
        return self

    def __exit__(self, *exc) -> None:
        if self._listener is not None:
            event.unregister("numba:compile", self._listener)
            self._listener = None


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    return f"{seconds // 60} min {seconds % 60:02d} s"
