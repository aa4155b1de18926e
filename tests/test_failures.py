"""Worker failures (docs/failures.md): against the reference, hand-worked failures with retry, the one-line errors."""

from __future__ import annotations

import pyarrow as pa
import pytest

import simcore
from simcore.config import ConfigError, load_config, merge_config
from simcore.engine.autoscale_nb import SCALE_EVENTS
from simcore.metrics.scaling import failure_summary
from tests.scenarios import failure_scenario, fast_as_reference, run_fast
from tests.test_against_reference import REQUEST_KEYS, reference

NUM_FAILURE_SCENARIOS = 150


@pytest.mark.parametrize("seed", range(NUM_FAILURE_SCENARIOS))
def test_failures_match_reference(seed):
    scenario = failure_scenario(seed)
    config, slow = reference(scenario)
    run, cols, _ = run_fast(scenario)
    fast = fast_as_reference(run, cols)
    for k, (f, s) in enumerate(zip(fast["requests"], slow["requests"])):
        assert {key: f[key] for key in REQUEST_KEYS} == {key: s[key] for key in REQUEST_KEYS}, f"request {k}"
        assert int(run.failures[k]) == s["failures"], f"request {k}"
    assert fast["tokens"] == slow["tokens"]
    assert fast["passes"] == slow["passes"]
    assert [(int(t), int(w), SCALE_EVENTS[int(e)]) for t, w, e in run.scale_log] == slow["scale_log"]
    # The summary's counts, from the reference's requests.
    fail = config["engine"]["failures"]
    retry = fail["on_failure"] == "retry"
    got = failure_summary(run.scale_log, run.failures, run.reject_ns, retry, fail["max_retries"])
    counts = [r["failures"] for r in slow["requests"]]
    resent = [min(c, fail["max_retries"]) if retry else 0 for c in counts]
    assert got == {
        "worker_failures": sum(e == "fail" for _, _, e in slow["scale_log"]),
        "failed_requests": sum(c > 0 for c in counts),
        "retried_requests": sum(r > 0 for r in resent),
        "retries": sum(resent),
        "lost_requests": sum(c > 0 and r["status"] == "rejected" for c, r in zip(counts, slow["requests"])),
    }


def test_failure_scenarios_fail_retry_and_lose():
    """The random scenarios lose requests, retry them, exhaust retries and find no worker up."""
    failed = retried = lost = cut = 0
    for seed in range(NUM_FAILURE_SCENARIOS):
        scenario = failure_scenario(seed)
        _, slow = reference(scenario)
        counts = [r["failures"] for r in slow["requests"]]
        failed += sum(c > 0 for c in counts)
        retried += sum(c > 1 or (c == 1 and r["status"] != "rejected") for c, r in zip(counts, slow["requests"]))
        lost += sum(c > 0 and r["status"] == "rejected" for c, r in zip(counts, slow["requests"]))
        cut += sum(e == "fail" for _, _, e in slow["scale_log"])
    assert min(failed, retried, lost, cut) >= 20, (failed, retried, lost, cut)


# ---------------------------------------------------------------- hand-worked failures

FIXED = {"type": "fixed", "prefill_ms": 10.0, "decode_ms": 2.0}


def run_rows(rows, failures, replicas=2, **extra):
    columns = {
        "request_id": [r[0] for r in rows], "input_tokens": [r[1] for r in rows],
        "output_tokens": [r[2] for r in rows], "send_ms": [float(r[3]) for r in rows],
    }
    config = {
        "load": {"type": "trace"}, "timing": FIXED, "output": {"passes": True},
        "engine": {"aggregated": {"replicas": replicas}, "router": {"policy": "least_outstanding"},
                   "failures": failures},
        **extra,
    }
    return simcore.run(config, requests=pa.table(columns))


def test_a_failure_retries_the_request_on_the_other_worker():
    # a (10 tokens) -> worker 0: prefill 0-10, tokens at 10, 12, 14; b (1 token)
    # -> worker 1 (send 1 scans from worker 1: 0 outstanding there, 1 on worker 0), done at 10.
    # Worker 0 fails at 15 ms, in a's pass 14-16: a is lost (3 tokens gone),
    # its client retries after 5 ms: at 20 ms only worker 1 is up -> prefill
    # 20-30, tokens at 30, 32, ..., 48.  TTFT from the first send: 30 ms.
    # The cut pass ends at 15 ms; the repair (115 ms) comes after the last event.
    result = run_rows([("a", 16, 10, 0), ("b", 16, 1, 0)],
                      {"at": [[0, 15.0]], "repair_ms": 100.0, "retry_delay_ms": 5.0})
    a, b = result.requests.to_pylist()
    assert (a["worker"], a["failures"], a["status"], a["generated_tokens"]) == (1, 1, "completed", 10)
    assert (a["send_ms"], a["engine_arrival_ms"], a["ttft_ms"], a["e2el_ms"]) == (0.0, 20.0, 30.0, 48.0)
    assert (b["worker"], b["failures"], b["e2el_ms"]) == (1, 0, 10.0)
    passes = result.passes.to_pylist()
    assert [(p["worker"], p["start_ms"], p["end_ms"]) for p in passes if p["worker"] == 0][-1] == (0, 14.0, 15.0)
    events = [(e["instant_ms"], e["worker"], e["event"]) for e in result.scaling.to_pylist()]
    assert events == [(0.0, 0, "start"), (0.0, 0, "ready"), (0.0, 1, "start"), (0.0, 1, "ready"),
                      (15.0, 0, "fail")]
    s = result.summary
    assert (s["worker_failures"], s["failed_requests"], s["retried_requests"], s["retries"], s["lost_requests"]) \
        == (1, 1, 1, 1, 0)


def test_on_failure_reject_takes_the_request_as_failed():
    result = run_rows([("a", 16, 10, 0), ("b", 16, 1, 0)],
                      {"at": [[0, 15.0]], "repair_ms": 100.0, "on_failure": "reject"})
    a = result.requests.to_pylist()[0]
    assert (a["status"], a["failures"], a["generated_tokens"], a["first_token_ms"]) == ("rejected", 1, 0, None)
    s = result.summary
    assert (s["rejected"], s["lost_requests"], s["rejected_context_length"], s["rejected_kv_capacity"]) == (1, 1, 0, 0)


def test_retries_back_off_until_a_worker_is_up_or_they_run_out():
    # One worker, down at 5 ms (a's prefill cut) until 15 ms.  a's retries:
    # 1 after 2 ms (7: none up, lost again), 2 after 4 ms (11: none up), 3
    # after 8 ms (19: up) -> prefill 19-29.  With max_retries 2 the third
    # loss (at 11 ms) is final.
    failures = {"at": [[0, 5.0]], "repair_ms": 10.0, "retry_delay_ms": 2.0, "max_retry_delay_ms": 8.0}
    a = run_rows([("a", 16, 1, 0)], {**failures, "max_retries": 3}, replicas=1).requests.to_pylist()[0]
    assert (a["status"], a["failures"], a["engine_arrival_ms"], a["ttft_ms"]) == ("completed", 3, 19.0, 29.0)
    result = run_rows([("a", 16, 1, 0)], {**failures, "max_retries": 2}, replicas=1)
    a = result.requests.to_pylist()[0]
    assert (a["status"], a["failures"]) == ("rejected", 3)
    assert (result.summary["retries"], result.summary["lost_requests"]) == (2, 1)


def test_random_failures_are_deterministic_with_the_seed():
    rows = [(str(i), 32, 20, i * 0.5) for i in range(60)]
    failures = {"mtbf_ms": 20.0, "repair_ms": 5.0, "retry_delay_ms": 1.0}
    first = run_rows(rows, failures, seed=3)
    again = run_rows(rows, failures, seed=3)
    other = run_rows(rows, failures, seed=4)
    assert first.requests.equals(again.requests) and first.scaling.equals(again.scaling)
    assert not first.scaling.equals(other.scaling)
    assert first.summary["worker_failures"] >= 1


def test_defaults_add_no_failure_output():
    result = simcore.run({"workload": {"num_requests": 4}, "timing": FIXED})
    assert "failures" not in result.requests.column_names and "worker_failures" not in result.summary


# ---------------------------------------------------------------- one-line errors

ON = {"at": [[0, 10.0]], "repair_ms": 1000.0}


@pytest.mark.parametrize("engine, extra, message", [
    ({"failures": {"at": [[0, 10.0]]}}, {}, "engine.failures.repair_ms must be set"),
    ({"failures": {**ON, "at": [[5, 10.0]]}}, {}, "engine.failures.at[0].worker must be < engine.aggregated.replicas"),
    ({"failures": {**ON, "at": [[0, -1]]}}, {}, "engine.failures.at[0].at_ms must be >= 0"),
    ({"failures": {**ON, "at": [0, 10.0]}}, {}, "engine.failures.at[0] must be a [worker, at_ms] pair"),
    ({"failures": {**ON, "at": "soon"}}, {}, "engine.failures.at must be a list"),
    ({"failures": {**ON, "mtbf_ms": 0}}, {}, "engine.failures.mtbf_ms must be > 0"),
    ({"failures": {**ON, "repair_ms": 0}}, {}, "engine.failures.repair_ms must be > 0"),
    ({"failures": {**ON, "on_failure": "ignore"}}, {}, "engine.failures.on_failure must be one of"),
    ({"failures": {**ON, "max_retries": -1}}, {}, "engine.failures.max_retries"),
    ({"failures": {**ON, "max_retries": 10_000}}, {}, "engine.failures.max_retries must be <= 1000"),
    ({"failures": {**ON, "retry_delay_ms": "1s"}}, {}, "engine.failures.retry_delay_ms must be a finite number"),
    ({"failures": {**ON, "max_retry_delay_ms": -2}}, {}, "engine.failures.max_retry_delay_ms must be >= 0"),
    ({"failures": {"repair_ms": 5.0}}, {}, "engine.failures.repair_ms has no effect here"),
    ({"failures": ON, "router": {"policy": "random"}}, {}, "engine.router.policy=random"),
    ({"failures": ON, "autoscale": {"metric": "outstanding", "target": 1, "startup_ms": 0}}, {},
     "is not modelled with engine.autoscale.metric=outstanding"),
    ({"failures": ON, "aggregated": {"replicas": 2, "prefix_caching": True}}, {},
     "engine.aggregated.prefix_caching=true is not modelled"),
    ({"failures": ON}, {"output": {"mode": "bounded"}}, "output.mode=bounded is not modelled"),
])
def test_each_key_fails_in_one_line(engine, extra, message):
    if "aggregated" not in engine:
        engine = {"aggregated": {"replicas": 2}, **engine}
    with pytest.raises(ConfigError) as info:
        load_config(merge_config({"engine": engine, **extra}))
    assert message in str(info.value) and "\n" not in str(info.value), str(info.value)
