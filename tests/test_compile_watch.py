"""The first-run display: compilations counted, and the time left from a recorded timeline."""

from __future__ import annotations

import importlib

import pytest
from numba import njit

from runners import compile_watch
from runners.compile_watch import CompileWatch, load_timeline, timeline_case
from simcore.config import load_config

TIMELINE = [("m.a", 1.0), ("m.b", 3.0), ("m.a", 6.0), ("m.c", 10.0)]


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_before_any_known_compilation_the_timeline_runs_at_its_own_pace():
    clock = Clock()
    watch = CompileWatch(TIMELINE, clock=clock)
    clock.now = 4.0
    assert watch.remaining_s() == pytest.approx(10.0 - 4.0)
    watch.finished("m.unknown")  # counted, but moves no estimate
    assert watch.done == 1 and watch.remaining_s() == pytest.approx(6.0)
    clock.now = 12.0
    assert watch.remaining_s() == 0.0


def test_the_pace_is_the_elapsed_time_over_the_timeline_at_the_last_match():
    clock = Clock()
    watch = CompileWatch(TIMELINE, clock=clock)
    clock.now = 2.0
    watch.finished("m.b")  # the timeline had spent 3 s here: this machine is at 2/3 of its pace
    assert watch.remaining_s() == pytest.approx((10.0 - 3.0) * 2.0 / 3.0)
    clock.now = 3.0  # one second later, nothing finished: that second is spent
    assert watch.remaining_s() == pytest.approx((10.0 - 3.0) * 2.0 / 3.0 - 1.0)
    clock.now = 5.0
    watch.finished("m.a")  # the second "m.a": matched after "m.b", at 6 s of the timeline
    assert watch.matched == 3
    assert watch.remaining_s() == pytest.approx((10.0 - 6.0) * 5.0 / 6.0)
    watch.finished("m.b")  # nothing after the match has this name: no move
    assert watch.matched == 3 and watch.done == 3


def test_describe_names_the_count_the_kernel_at_work_and_the_time_left():
    clock = Clock()
    watch = CompileWatch(TIMELINE, clock=clock)
    watch.active.append("simcore.engine.nb.simulate_engine_nb")
    clock.now = 2.0
    watch.finished("m.b")
    assert watch.describe() == "compiling kernels 1/~4 (simulate_engine_nb), ~5 s left"
    assert CompileWatch([], clock=clock).describe() == "compiling kernels 0"
    slow = CompileWatch([("m.a", 100.0)], clock=clock)
    clock.now = 4.0
    assert slow.describe() == "compiling kernels 0/~1, ~1 min 38 s left"  # 100 s of timeline, 2 s elapsed


def test_the_watch_counts_numba_compilations_while_open():
    @njit
    def twice(x):
        return 2 * x

    with CompileWatch([]) as watch:
        twice(1)
        twice(1.5)  # a second signature
    assert watch.done == 2 and watch.active == []
    twice(2j)  # closed: not counted
    assert watch.done == 2


def test_the_case_follows_the_configuration(monkeypatch):
    monkeypatch.setattr(compile_watch, "_timelines", lambda: dict.fromkeys(["default", "pd", "prefix", "sglang"]))
    assert timeline_case(load_config({})) == "default"
    assert timeline_case(load_config({"engine": {"mode": "disaggregated"}})) == "pd"
    assert timeline_case(load_config({"engine": {"aggregated": {"prefix_caching": True}}})) == "prefix"
    assert timeline_case(load_config({"engine": {"policy": "sglang"}})) == "sglang"
    assert timeline_case(load_config({"engine": {"policy": "trtllm"}})) == "default"  # no timeline of its own


def test_every_kernel_of_the_shipped_timelines_exists():
    """A renamed or removed kernel means the timelines are stale: rerun bench/bench_compile.py --write-timeline."""
    cases = compile_watch._timelines()
    assert "default" in cases
    for case in cases:
        timeline = load_timeline(case)
        assert timeline and all(b[1] >= a[1] for a, b in zip(timeline, timeline[1:]))
        for kernel, _ in timeline:
            module, _, name = kernel.rpartition(".")
            if module.startswith("simcore"):  # numba's own overloads aside
                assert hasattr(importlib.import_module(module), name), f"{case}: {kernel} is not in simcore"
