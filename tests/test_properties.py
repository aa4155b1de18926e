"""Properties every run must satisfy, on random configurations through the API,
and the queueing laws that tie the results together."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pytest

import simcore
from simcore.config import merge_config
from tests.scenarios import random_scenario

STATUSES = {"completed", "rejected", "incomplete"}


def random_config(seed: int) -> dict:
    """A random synthetic-workload config: distributions, loads, tight KV, stages."""
    rnd = random.Random(1000 + seed)
    output_dist = rnd.choice(["fixed", "normal", "lognormal"])
    load = rnd.choice(
        [
            {"type": "closed_loop", "concurrency": rnd.randint(1, 12), "think_time_ms": rnd.choice([0.0, 1.0])},
            {"type": "poisson", "request_rate": rnd.choice([50.0, 400.0])},
            {"type": "gamma", "request_rate": 200.0, "burstiness": rnd.choice([0.5, 2.0])},
            {"type": "constant_rate", "request_rate": 300.0},
        ]
    )
    return {
        "seed": seed,
        "workload": {
            "num_requests": rnd.randint(10, 60),
            "input_tokens": rnd.randint(8, 200),
            "output_tokens": rnd.randint(1, 24),
            "input_dist": "uniform",
            "output_dist": output_dist,
            "range_ratio": 0.5,
            "output_std": 0.0 if output_dist == "fixed" else 4.0,
        },
        "load": load,
        "engine": {
            "aggregated": {
                "replicas": rnd.randint(1, 2),
                "attention_dp": rnd.randint(1, 2),
                "max_batched_tokens": rnd.choice([32, 256]),
                "max_sequences": rnd.randint(2, 16),
                "num_blocks": rnd.choice([12, 40, 400]),
                "block_size": rnd.choice([4, 16]),
            }
        },
        "timing": {"type": "linear", "base_ms": 2.0, "per_prefill_token_us": 20.0, "per_decode_seq_us": 10.0, "per_kv_token_ns": 30.0},
        "tokenization": {"workers": rnd.randint(1, 2), "base_ms": 0.3, "per_input_us": 5.0},
        "detokenization": {"workers": rnd.randint(1, 3), "base_ms": rnd.choice([0.0, 2.85]), "per_output_us": 61.6, "chunk_size": rnd.choice([None, 4])},
        "max_time_ms": rnd.choice([None, 200.0]),
        "output": {"passes": True, "tokens": True},
    }


CONFIGS = [random_config(seed) for seed in range(40)]


@pytest.fixture(scope="module", params=range(len(CONFIGS)))
def result(request):
    return simcore.run(CONFIGS[request.param])


def test_every_request_ends_in_exactly_one_status(result):
    status = result.requests.column("status").to_pylist()
    assert len(status) == result.requests.num_rows and set(status) <= STATUSES
    s = result.summary
    assert s["completed"] + s["rejected"] + s["incomplete"] == s["num_requests"] == len(status)


def test_completed_requests_received_every_emitted_token(result):
    tokens = result.tokens.to_pylist()
    received, emitted = {}, {}
    for tok in tokens:
        emitted[tok["request_id"]] = emitted.get(tok["request_id"], 0) + 1
        received[tok["request_id"]] = received.get(tok["request_id"], 0) + (tok["received_ms"] is not None)
    for row in result.requests.to_pylist():
        rid = row["request_id"]
        assert emitted.get(rid, 0) == row["generated_tokens"]
        if row["status"] == "completed":
            assert received[rid] == row["generated_tokens"] >= 1
            assert row["generated_tokens"] <= row["output_tokens"]


def test_blocks_in_use_never_exceed_the_cache(result):
    blocks = np.asarray(result.passes.column("blocks_in_use"))
    assert (blocks <= result.config.engine.aggregated.num_blocks).all()
    emitted = result.requests.column("first_token_emit_ms").drop_null()
    assert blocks.size > 0 or len(emitted) == 0  # a token needs a pass that ended


def test_ttft_stages_sum_to_ttft_in_ns(result):
    stages = ["tokenization_ms", "queue_ms", "prefill_ms", "transfer_ms", "decode_wait_ms", "detokenization_ms"]
    for row in result.requests.to_pylist():
        if row["ttft_ms"] is None:
            continue
        total_ns = sum(round(row[s] * 1e6) for s in stages)
        assert total_ns == round(row["ttft_ms"] * 1e6)


def test_per_request_instants_are_ordered(result):
    order = ["send_ms", "engine_arrival_ms", "first_admit_ms", "first_token_emit_ms", "first_token_ms", "last_token_ms"]
    for row in result.requests.to_pylist():
        present = [row[k] for k in order if row[k] is not None]
        assert present == sorted(present), row["request_id"]
        if row["status"] == "completed":
            assert row["e2el_ms"] >= row["ttft_ms"]
    cap = result.config.max_time_ms
    if cap is not None:
        times = result.requests.column("last_token_ms").drop_null().to_pylist()
        assert all(t <= cap for t in times)
        assert result.summary["duration_s"] is None or result.summary["duration_s"] * 1e3 <= cap + 1e-9


def test_receipts_of_one_request_never_go_backwards(result):
    last = {}
    for tok in result.tokens.to_pylist():
        if tok["received_ms"] is None:
            continue
        assert tok["received_ms"] >= tok["emitted_ms"]
        assert tok["received_ms"] >= last.get(tok["request_id"], -1.0)
        last[tok["request_id"]] = tok["received_ms"]


def test_same_seed_gives_identical_tables():
    config = CONFIGS[3]
    a, b = simcore.run(config), simcore.run(config)
    assert a.requests.equals(b.requests) and a.tokens.equals(b.tokens) and a.passes.equals(b.passes)
    assert a.summary == b.summary
    other = simcore.run(merge_config(config) | {"seed": config["seed"] + 1})
    assert not other.requests.equals(a.requests)  # the seed does drive the draws


@pytest.mark.parametrize("seed", range(60))
def test_zero_costs_are_bit_identical_to_stages_off(seed):
    scenario = random_scenario(seed)
    config = merge_config(scenario["config"])
    columns = {"request_id": scenario["ids"], "input_tokens": scenario["inputs"], "output_tokens": scenario["outputs"]}
    if scenario["send_ns"] is not None:
        columns["send_ms"] = [t / 1e6 for t in scenario["send_ns"]]
    table = pa.table(columns)
    config["output"] = {"dir": None, "passes": True, "tokens": True}
    off = merge_config(config)
    off["tokenization"] = {"workers": 1, "base_ms": 0.0, "per_input_us": 0.0}
    off["detokenization"] = {"workers": 1, "base_ms": 0.0, "per_output_us": 0.0, "chunk_size": None, "first_output_us": 0.0, "final_output_us": 0.0}
    zero = merge_config(off)
    zero["tokenization"] = {"workers": 3, "base_ms": 0.0, "per_input_us": 0.0}
    zero["detokenization"] = {"workers": 3, "base_ms": 0.0, "per_output_us": 0.0, "chunk_size": 2, "first_output_us": 0.0, "final_output_us": 0.0}
    a, b = simcore.run(off, requests=table), simcore.run(zero, requests=table)
    assert a.requests.equals(b.requests) and a.tokens.equals(b.tokens) and a.passes.equals(b.passes)
    assert a.summary == b.summary


def test_littles_law_on_a_long_closed_loop():
    """Closed loop without think time: C requests are always in flight until the
    last send, so throughput x mean E2EL = C, up to the final drain."""
    C, N = 16, 3000
    result = simcore.run(
        {
            "workload": {"num_requests": N, "input_tokens": 256, "output_tokens": 32, "input_dist": "uniform", "range_ratio": 0.5},
            "load": {"type": "closed_loop", "concurrency": C},
            "detokenization": {"workers": 2, "base_ms": 2.85, "per_output_us": 61.6},
        }
    )
    s = result.summary
    assert s["completed"] == N
    in_flight = s["request_throughput"] * s["mean_e2el_ms"] / 1e3
    # The drain (the last C requests finishing with fewer in flight) is at most
    # C x max E2EL out of the whole run's C x duration.
    drain = s["max_e2el_ms"] / 1e3 / s["duration_s"]
    assert abs(in_flight - C) / C <= drain
    assert drain < 0.02  # the run is long enough for the law to bite


def test_open_loop_send_instants_follow_the_load():
    n = 200
    base = {"workload": {"num_requests": n, "input_tokens": 16, "output_tokens": 2}}
    const = simcore.run(base | {"load": {"type": "constant_rate", "request_rate": 250.0}})
    send = np.asarray(const.requests.column("send_ms"))
    np.testing.assert_array_equal(send, np.arange(n) * 1000 / 250.0)
    poisson = simcore.run(base | {"load": {"type": "poisson", "request_rate": 250.0}, "seed": 7})
    gaps = np.diff(np.asarray(poisson.requests.column("send_ms")))
    assert poisson.requests.column("send_ms")[0].as_py() == 0.0
    # mean gap 4 ms; the sample mean of 199 exponential gaps has std 4/sqrt(199) = 0.28 ms
    assert abs(gaps.mean() - 4.0) < 4 * 0.284


def test_trace_send_times_are_shifted_and_sped_up():
    table = pa.table({"input_tokens": [10, 10, 10], "output_tokens": [1, 1, 1], "send_ms": [100.0, 150.0, 300.0]})
    config = {"load": {"type": "trace", "speedup": 2.0}}
    result = simcore.run(config, requests=table)
    assert result.requests.column("send_ms").to_pylist() == [0.0, 25.0, 100.0]
    assert result.requests.column("request_id").to_pylist() == ["r0", "r1", "r2"]


def test_synthetic_length_distributions_stay_in_range():
    config = {"workload": {"num_requests": 500, "input_tokens": 100, "output_tokens": 50, "input_dist": "uniform", "range_ratio": 0.8, "output_dist": "lognormal", "output_std": 30.0}}
    rows = simcore.run(config).requests
    inputs = np.asarray(rows.column("input_tokens"))
    outputs = np.asarray(rows.column("output_tokens"))
    assert inputs.min() >= 80 and inputs.max() <= 100 and len(set(inputs)) > 10
    assert outputs.min() >= 1 and abs(outputs.mean() - 50) < 5
