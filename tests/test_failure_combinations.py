"""Worker failures combined with other features (docs/failures.md): multi-turn sessions against the
reference and by hand; the combinations still refused, each in one line naming both keys."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

import simcore
from simcore.config import ConfigError, load_config, merge_config
from simcore.engine.autoscale_nb import SCALE_EVENTS
from tests.reference.sim import simulate as reference_simulate
from tests.test_sessions import compare_sessions_with_reference, random_session_scenario

NUM_SESSION_FAILURE_SCENARIOS = 60


def session_failure_scenario(seed: int) -> dict:
    """A random multi-turn sessions scenario (``tests.test_sessions``, the three scheduling policies in turn)
    over 2-4 replicas of 1-2 ranks with worker failures drawn as ``tests.scenarios.failure_scenario`` draws them."""
    scenario = random_session_scenario(seed, policy=("vllm", "sglang", "trtllm")[seed % 3])
    rnd = random.Random(seed + 5_000_011)
    engine = scenario["config"]["engine"]
    pool = engine["aggregated"]
    pool["replicas"] = rnd.randint(2, 4)
    pool["attention_dp"] = rnd.randint(1, 2)
    pool["rank_policy"] = rnd.choice(["round_robin", "least_loaded"])
    if pool.get("chunked_prefill_size") is not None:  # sglang: a page per rank
        pool["chunked_prefill_size"] = max(pool["chunked_prefill_size"], pool["block_size"] * pool["attention_dp"])
    engine["router"] = {"policy": rnd.choice(["round_robin", "least_outstanding", "least_tokens"])}
    fixed = [[rnd.randrange(pool["replicas"]), rnd.choice([0.0, 1.0, rnd.uniform(0.0, 15.0)])]
             for _ in range(rnd.randint(0, 3))]
    mtbf = rnd.choice([None, 2.0, 5.0, 20.0]) if fixed else rnd.choice([2.0, 5.0, 20.0])
    engine["failures"] = {
        "at": fixed, "mtbf_ms": mtbf, "repair_ms": rnd.choice([0.001, 0.5, 3.0, 10.0]),
        "on_failure": rnd.choice(["retry", "retry", "reject"]), "max_retries": rnd.randint(0, 3),
        "retry_delay_ms": rnd.choice([0.0, 0.3, 1.0]), "max_retry_delay_ms": rnd.choice([1.0, 2.0]),
    }
    scenario["config"]["seed"] = rnd.randint(0, 10_000)
    return scenario


@pytest.mark.parametrize("seed", range(NUM_SESSION_FAILURE_SCENARIOS))
def test_sessions_with_failures_match_reference(seed):
    scenario = session_failure_scenario(seed)
    run, _, slow = compare_sessions_with_reference(scenario)
    assert [int(f) for f in run.failures] == [r["failures"] for r in slow["requests"]]
    assert [(int(t), int(w), SCALE_EVENTS[int(e)]) for t, w, e in run.scale_log] == slow["scale_log"]


def test_session_scenarios_lose_retry_and_fail_turns():
    lost = retried = failed = 0
    for seed in range(NUM_SESSION_FAILURE_SCENARIOS):
        scenario = session_failure_scenario(seed)
        config = merge_config(scenario["config"])
        slow = reference_simulate(config, scenario["ids"], scenario["inputs"], scenario["outputs"],
                                  scenario["send_ns"],
                                  sessions={"session": scenario["session"], "shared_prefix_tokens": scenario["system"]})
        for r in slow["requests"]:
            lost += r["failures"] > 0
            retried += r["failures"] > 0 and r["status"] == "completed"
            failed += r["failures"] > 0 and r["status"] == "rejected"
    assert min(lost, retried, failed) >= 10, (lost, retried, failed)


# ---------------------------------------------------------------- hand-worked

def run_session(failures):
    # One session of two turns: a (16 prompt tokens, 10 out), then b (40, 1),
    # one client (closed loop), no think time; fixed timing 10 ms / 2 ms.
    table = pa.table({"session_id": ["x", "x"], "turn": [0, 1], "input_tokens": [16, 40],
                      "output_tokens": [10, 1]})
    config = {
        "load": {"type": "closed_loop", "concurrency": 1}, "workload": {"sessions": {"think_time_ms": 0.0}},
        "timing": {"type": "fixed", "prefill_ms": 10.0, "decode_ms": 2.0},
        "engine": {"aggregated": {"replicas": 2}, "router": {"policy": "least_outstanding"},
                   "failures": {"at": [[0, 15.0]], "repair_ms": 100.0, "retry_delay_ms": 5.0, **failures}},
    }
    return simcore.run(config, requests=table).requests.to_pylist()


def test_a_lost_turn_is_retried_and_its_session_goes_on():
    # a (send 0, scan from worker 0: a tie) -> worker 0: prefill 0-10, tokens
    # at 10, 12, 14; worker 0 fails at 15: a is lost, retried at 20 on worker
    # 1 (the one up): prefill 20-30, tokens at 30, ..., 48 (TTFT 30 from its
    # first send).  Its end at 48 releases turn b: sent at 48 -> worker 1
    # (worker 0 is repaired at 115): prefill 48-58.
    a, b = run_session({})
    assert (a["status"], a["failures"], a["worker"], a["ttft_ms"], a["e2el_ms"]) == ("completed", 1, 1, 30.0, 48.0)
    assert (b["status"], b["failures"], b["worker"], b["send_ms"], b["ttft_ms"]) == ("completed", 0, 1, 48.0, 10.0)


def test_a_failed_turn_releases_its_sessions_next_turn():
    # As above with on_failure: reject: a is taken as failed at 15 ms, which
    # ends it at the client and releases b at once: sent at 15 -> worker 1.
    a, b = run_session({"on_failure": "reject"})
    assert (a["status"], a["failures"], a["generated_tokens"]) == ("rejected", 1, 0)
    assert (b["status"], b["worker"], b["send_ms"], b["ttft_ms"]) == ("completed", 1, 15.0, 10.0)


# ---------------------------------------------------------------- still refused, in one line naming both keys

ON = {"at": [[0, 10.0]], "repair_ms": 1000.0}


@pytest.mark.parametrize("engine, extra, message", [
    ({"aggregated": {"replicas": 2}, "failures": ON, "autoscale": {"metric": "ttft", "target": 1, "startup_ms": 0}},
     {}, "engine.failures.at or engine.failures.mtbf_ms is not modelled with engine.autoscale.metric=ttft"),
    ({"aggregated": {"replicas": 2, "prefix_caching": True}, "failures": ON}, {},
     "engine.aggregated.prefix_caching=true is not modelled with engine.failures.at or engine.failures.mtbf_ms"),
    ({"aggregated": {"replicas": 2}, "failures": ON}, {"output": {"mode": "bounded"}},
     "output.mode=bounded is not modelled with engine.failures.at or engine.failures.mtbf_ms"),
    ({"mode": "disaggregated", "failures": ON}, {},
     "engine.failures.at is only used by engine.mode=aggregated"),
])
def test_refused_combinations_name_both_keys(engine, extra, message):
    with pytest.raises(ConfigError) as info:
        load_config(merge_config({"engine": engine, **extra}))
    assert message in str(info.value) and "\n" not in str(info.value), str(info.value)
