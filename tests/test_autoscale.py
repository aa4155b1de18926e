"""Autoscaling (docs/autoscaling.md): against the reference, hand-worked decisions, the one-line errors."""

from __future__ import annotations

import math

import pyarrow as pa
import pytest

import simcore
from simcore.config import ConfigError, load_config, merge_config
from simcore.metrics.scaling import scaling_summary
from tests.reference.autoscale import scaling_summary as reference_scaling_summary
from tests.scenarios import autoscale_scenario, fast_as_reference, run_fast
from tests.test_against_reference import REQUEST_KEYS, assert_summaries_equal, reference
from tests.reference.metrics import summarize as reference_summarize
from simcore.engine.autoscale_nb import SCALE_EVENTS

NUM_AUTOSCALE_SCENARIOS = 120


def _log(run) -> list[tuple[int, int, str]]:
    return [(int(t), int(w), SCALE_EVENTS[int(e)]) for t, w, e in run.scale_log]


@pytest.mark.parametrize("seed", range(NUM_AUTOSCALE_SCENARIOS))
def test_autoscaling_matches_reference(seed):
    scenario = autoscale_scenario(seed)
    config, slow = reference(scenario)
    run, cols, summary = run_fast(scenario)
    fast = fast_as_reference(run, cols)
    for k, (f, s) in enumerate(zip(fast["requests"], slow["requests"])):
        assert {key: f[key] for key in REQUEST_KEYS} == {key: s[key] for key in REQUEST_KEYS}, f"request {k}"
    assert fast["tokens"] == slow["tokens"]
    assert fast["passes"] == slow["passes"]
    assert _log(run) == slow["scale_log"]
    cfg = load_config(scenario["config"])
    cap_ns = None if config["max_time_ms"] is None else round(config["max_time_ms"] * 1e6)
    pool = cfg.engine.aggregated
    summary.update(scaling_summary(run.scale_log, cols, cfg.metrics.goodput, pool.replicas, pool.attention_dp,
                                   run.cap_ns))
    slow_summary = reference_summarize(slow, scenario["inputs"], scenario["outputs"], config["metrics"]["percentiles"],
                                       config["metrics"]["goodput"], cap_ns)
    slow_summary.update(reference_scaling_summary(slow["scale_log"], slow["requests"], config["metrics"]["goodput"],
                                                  pool.attention_dp, cap_ns))
    assert_summaries_equal(summary, slow_summary)


def test_autoscale_scenarios_scale_both_ways():
    """The random scenarios start, ready, drain and stop replicas, and cancel starts (each several times);
    a draining replica made ready again is the hand-worked case below."""
    seen = {event: 0 for event in ("start", "ready", "drain", "off")}
    resumed = cancelled = 0
    for seed in range(NUM_AUTOSCALE_SCENARIOS):
        scenario = autoscale_scenario(seed)
        _, slow = reference(scenario)
        status = {}
        for t, w, event in slow["scale_log"]:
            seen[event] += t > 0
            resumed += event == "ready" and status.get(w) == "drain"
            cancelled += event == "off" and status.get(w) == "start"
            status[w] = event
    assert min(seen.values()) >= 10, seen
    assert cancelled >= 2, (resumed, cancelled)


# ---------------------------------------------------------------- hand-worked decisions

FIXED = {"type": "fixed", "prefill_ms": 10.0, "decode_ms": 2.0}


def run_rows(rows, scale, replicas=2, **pool):
    """Rows (request_id, input, output, send_ms) on an autoscaled pool, least_outstanding routing."""
    columns = {
        "request_id": [r[0] for r in rows], "input_tokens": [r[1] for r in rows],
        "output_tokens": [r[2] for r in rows], "send_ms": [float(r[3]) for r in rows],
    }
    config = {
        "load": {"type": "trace"}, "timing": FIXED,
        "engine": {"aggregated": {"replicas": replicas, **pool}, "router": {"policy": "least_outstanding"},
                   "autoscale": {"metric": "outstanding", "target": 1.0, "interval_ms": 5.0, "min_replicas": 1,
                                 **scale}},
    }
    return simcore.run(config, requests=pa.table(columns))


def events(result):
    return [(row["instant_ms"], row["worker"], row["event"]) for row in result.scaling.to_pylist()]


def test_scale_up_waits_for_the_startup_then_takes_requests():
    # a (1 token) on worker 0: pass 0-10; b sent at 1 ms waits behind it.
    # Decision at 5 ms: 2 outstanding / target 1 -> 2 replicas: worker 1
    # starts, ready at 5 + 3 = 8 ms.  At 10 ms the decision (before a's pass
    # end) reads 2 again: nothing.  c at 12 ms: worker 0 has b (1), worker 1
    # none -> worker 1, idle: its token at 22 ms (TTFT 10 ms).  b's pass
    # 10-20 (TTFT 19 ms).  Decisions at 15 and 20 read 2 (b, c): nothing;
    # nothing is pending after 22 ms.
    result = run_rows([("a", 16, 1, 0), ("b", 16, 1, 1), ("c", 16, 1, 12)], {"startup_ms": 3.0})
    rows = result.requests.to_pylist()
    assert [r["worker"] for r in rows] == [0, 0, 1]
    assert [r["ttft_ms"] for r in rows] == [10.0, 19.0, 10.0]
    assert events(result) == [(0.0, 0, "start"), (0.0, 0, "ready"), (5.0, 1, "start"), (8.0, 1, "ready")]
    s = result.summary
    # Up: worker 0 over the run (0-22 ms), worker 1 from its start (5-22 ms).
    assert s["replica_seconds"] == pytest.approx((22 + 17) / 1e3, rel=1e-12)
    assert s["gpu_seconds"] == s["replica_seconds"]  # one GPU per replica
    # Ready: 1 over 0-8 ms, 2 over 8-22 ms.
    assert s["mean_ready_replicas"] == pytest.approx((1 * 8 + 2 * 14) / 22, rel=1e-12)
    assert (s["max_ready_replicas"], s["scale_ups"], s["scale_downs"]) == (2, 1, 0)


def test_scale_down_drains_then_stops():
    # Worker 1 starts and is ready at 5 ms (startup 0, 2 outstanding on worker 0).
    # c (8 tokens) at 6 ms -> worker 1 (0 outstanding): prefill 6-16, decodes to 30 ms.
    # Decision at 25 ms: worker 0 has none, worker 1 has c -> 1 replica:
    # worker 1 (the highest ready) drains, c still running.  At 30 ms the
    # decision reads c (its pass end comes after): 1 desired, 1 active.  c
    # ends at 30 ms, then d is sent: worker 1 drains, so worker 0 (a tie on
    # 0 outstanding would have gone to worker 1: the scan starts at send 3
    # mod 2).  Worker 1, drained and idle, is off at 30 ms.
    result = run_rows([("a", 16, 1, 0), ("b", 16, 1, 1), ("c", 16, 8, 6), ("d", 16, 1, 30)], {"startup_ms": 0.0})
    rows = result.requests.to_pylist()
    assert [r["worker"] for r in rows] == [0, 0, 1, 0]
    assert rows[2]["e2el_ms"] == 24.0 and rows[3]["ttft_ms"] == 10.0
    assert events(result) == [
        (0.0, 0, "start"), (0.0, 0, "ready"), (5.0, 1, "start"), (5.0, 1, "ready"), (25.0, 1, "drain"),
        (30.0, 1, "off"),
    ]
    s = result.summary
    assert s["replica_seconds"] == pytest.approx((40 + 25) / 1e3, rel=1e-12)  # worker 1 up 5-30 ms, d ends at 40
    assert (s["scale_ups"], s["scale_downs"]) == (1, 1)


def test_a_start_is_cancelled_when_the_load_falls_first():
    # Worker 1 starts at 5 ms (2 outstanding), ready only at 55 ms.  At 15 ms
    # worker 0 holds b alone: 1 desired, 2 active -> the starting worker is
    # off (a start is cancelled before any ready worker drains).  c at 21 ms
    # goes to worker 0 (pass 21-31).
    result = run_rows([("a", 16, 1, 0), ("b", 16, 1, 1), ("c", 16, 1, 21)], {"startup_ms": 50.0})
    assert [r["worker"] for r in result.requests.to_pylist()] == [0, 0, 0]
    assert events(result) == [(0.0, 0, "start"), (0.0, 0, "ready"), (5.0, 1, "start"), (15.0, 1, "off")]
    s = result.summary
    assert s["replica_seconds"] == pytest.approx((31 + 10) / 1e3, rel=1e-12)
    assert (s["mean_ready_replicas"], s["max_ready_replicas"], s["scale_ups"], s["scale_downs"]) == (1.0, 1, 1, 1)


def test_a_draining_replica_is_ready_again_before_any_start():
    # As the drain case, c with 12 tokens (decodes to 38 ms): worker 1 drains
    # at 25 ms.  e and f (26, 27 ms) go to worker 0, the only ready one.  At
    # 30 ms the load is 3 (e, f; c) -> 2 desired, 1 active: the draining
    # worker 1 is ready again at once (no startup; worker 0 stays the only
    # other).  g at 31 ms: worker 0 has 2, worker 1 has c -> worker 1.
    rows = [("a", 16, 1, 0), ("b", 16, 1, 1), ("c", 16, 12, 6), ("e", 16, 1, 26), ("f", 16, 1, 27),
            ("g", 16, 1, 31)]
    result = run_rows(rows, {"startup_ms": 0.0})
    assert [r["worker"] for r in result.requests.to_pylist()] == [0, 0, 1, 0, 0, 1]
    assert events(result)[:6] == [
        (0.0, 0, "start"), (0.0, 0, "ready"), (5.0, 1, "start"), (5.0, 1, "ready"), (25.0, 1, "drain"),
        (30.0, 1, "ready"),
    ]


def test_min_replicas_hold_without_load():
    # 3 replicas, min 2: both ready at 0; a lone request (load 1 -> 1 desired)
    # never takes the pool below 2.
    result = run_rows([("a", 16, 8, 0), ("b", 16, 1, 20)], {"startup_ms": 0.0, "min_replicas": 2}, replicas=3)
    assert events(result) == [(0.0, 0, "start"), (0.0, 0, "ready"), (0.0, 1, "start"), (0.0, 1, "ready")]
    assert result.summary["mean_ready_replicas"] == 2.0 and result.summary["scale_ups"] == 0


def test_kv_usage_metric_scales_on_the_blocks_in_use():
    # a: 64 prompt tokens in 16-token blocks on 6 blocks -> 4 or 5 blocks in
    # use during its prefill (0-10 ms): usage 4/6 or 5/6, / target 0.5 ->
    # ceil(1.33 or 1.67) = 2 replicas at the 5 ms decision.  Its decode keeps them (6 tokens: to 20 ms).
    result = run_rows([("a", 64, 6, 0), ("b", 16, 1, 12)],
                      {"metric": "kv_usage", "target": 0.5, "startup_ms": 0.0}, block_size=16, num_blocks=6)
    assert events(result)[2:4] == [(5.0, 1, "start"), (5.0, 1, "ready")]
    assert [r["worker"] for r in result.requests.to_pylist()] == [0, 1]


def test_slo_attainment_counts_every_request():
    # The scale-up case with a TTFT target of 15 ms: a (10) and c (10) meet it, b (19) not: 2 of 3.
    rows = [("a", 16, 1, 0), ("b", 16, 1, 1), ("c", 16, 1, 12)]
    columns = {"request_id": [r[0] for r in rows], "input_tokens": [r[1] for r in rows],
               "output_tokens": [r[2] for r in rows], "send_ms": [float(r[3]) for r in rows]}
    config = {
        "load": {"type": "trace"}, "timing": FIXED, "metrics": {"goodput": {"ttft_ms": 15.0}},
        "engine": {"aggregated": {"replicas": 2}, "router": {"policy": "least_outstanding"},
                   "autoscale": {"metric": "outstanding", "target": 1.0, "interval_ms": 5.0, "startup_ms": 3.0}},
    }
    summary = simcore.run(config, requests=pa.table(columns)).summary
    assert math.isclose(summary["slo_attainment"], 2 / 3, rel_tol=1e-15)


def test_defaults_add_no_scaling_output():
    result = simcore.run({"workload": {"num_requests": 4}, "timing": FIXED})
    assert result.scaling is None and "gpu_seconds" not in result.summary


# ---------------------------------------------------------------- one-line errors

ON = {"metric": "outstanding", "target": 2.0, "startup_ms": 1000.0}


@pytest.mark.parametrize("engine, message", [
    ({"autoscale": {"metric": "cpu"}}, "engine.autoscale.metric must be one of"),
    ({"autoscale": {**ON, "target": None}}, "engine.autoscale.target must be set"),
    ({"autoscale": {**ON, "target": 0}}, "engine.autoscale.target must be > 0"),
    ({"autoscale": {**ON, "metric": "kv_usage", "target": 1.5}}, "engine.autoscale.target must be <= 1"),
    ({"autoscale": {**ON, "startup_ms": None}}, "engine.autoscale.startup_ms must be set"),
    ({"autoscale": {**ON, "startup_ms": -1}}, "engine.autoscale.startup_ms must be >= 0"),
    ({"autoscale": {**ON, "startup_ms": 1e12}}, "engine.autoscale.startup_ms must be <="),
    ({"autoscale": {**ON, "interval_ms": 0}}, "engine.autoscale.interval_ms must be > 0"),
    ({"autoscale": {**ON, "interval_ms": "1s"}}, "engine.autoscale.interval_ms must be a finite number"),
    ({"autoscale": {**ON, "min_replicas": 0}}, "engine.autoscale.min_replicas"),
    ({"autoscale": {**ON, "min_replicas": 3}}, "engine.autoscale.min_replicas must be <= engine.aggregated.replicas"),
    ({"autoscale": {"target": 2.0}}, "engine.autoscale.target has no effect here"),
    ({"autoscale": ON, "router": {"policy": "power_of_two"}}, "engine.router.policy=power_of_two"),
    ({"autoscale": ON, "aggregated": {"replicas": 2, "prefix_caching": True}},
     "engine.aggregated.prefix_caching=true is not modelled"),
    ({"mode": "disaggregated", "autoscale": ON, "prefill": {"replicas": 2, "prefix_caching": True}},
     "engine.prefill.prefix_caching=true is not modelled with engine.autoscale.metric=outstanding"),
])
def test_each_key_fails_in_one_line(engine, message):
    if "aggregated" not in engine and "mode" not in engine:
        engine = {"aggregated": {"replicas": 2}, **engine}
    with pytest.raises(ConfigError) as info:
        load_config(merge_config({"engine": engine}))
    assert message in str(info.value) and "\n" not in str(info.value), str(info.value)
