"""Saturation verdict, rejection reasons and the terminal summary table.

Expected values come from arithmetic on the configured service: with
``max_sequences=1`` and fixed timing a request of 2 output tokens takes one
prefill pass (10 ms, it emits the first token) and one decode pass (10 ms),
so the deployment serves one request per 20 ms: 50 req/s.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

import simcore
from runners.report import format_summary, percentile_names

SERVICE_RATE = 1000.0 / (10.0 + 10.0)  # req/s: one prefill + one decode pass of 10 ms each


def open_loop(rate: float, **metrics) -> dict:
    return simcore.run({
        "workload": {"num_requests": 400, "input_tokens": 16, "output_tokens": 2},
        "load": {"type": "constant_rate", "request_rate": rate},
        "timing": {"type": "fixed", "prefill_ms": 10.0, "decode_ms": 10.0},
        "engine": {"aggregated": {"max_sequences": 1}},
        "metrics": metrics,
    }).summary


def test_an_open_loop_at_twice_the_service_rate_is_saturated():
    summary = open_loop(2 * SERVICE_RATE)
    assert summary["saturated"] is True
    # Arrivals at the offered rate, departures at the service rate (one boundary request either way).
    window_s = 399 / (2 * SERVICE_RATE) / 2
    assert summary["arrival_rate_second_half"] == pytest.approx(2 * SERVICE_RATE, abs=1 / window_s)
    assert summary["departure_rate_second_half"] == pytest.approx(SERVICE_RATE, abs=1 / window_s)


def test_an_open_loop_at_half_the_service_rate_is_not_saturated():
    summary = open_loop(SERVICE_RATE / 2)
    assert summary["saturated"] is False
    # Every request leaves 20 ms after its send: departures trail arrivals by at most one.
    window_s = 399 / (SERVICE_RATE / 2) / 2
    assert summary["arrival_rate_second_half"] == pytest.approx(SERVICE_RATE / 2, abs=1 / window_s)
    assert summary["departure_rate_second_half"] == pytest.approx(SERVICE_RATE / 2, abs=1 / window_s)
    assert summary["mean_e2el_ms"] == 20.0


def test_a_closed_loop_is_not_saturated_and_a_short_run_gets_no_verdict():
    summary = simcore.run({"workload": {"num_requests": 640}, "load": {"concurrency": 64}}).summary
    assert summary["saturated"] is False
    tiny = simcore.run({"workload": {"num_requests": 8}, "load": {"concurrency": 2}}).summary
    assert tiny["saturated"] is None and tiny["arrival_rate_second_half"] is None


def replay(inputs: list[int], engine: dict) -> dict:
    table = pa.table({
        "request_id": [f"r{i}" for i in range(len(inputs))],
        "input_tokens": pa.array(inputs, pa.int64()),
        "output_tokens": pa.array([2] * len(inputs), pa.int64()),
    })
    return simcore.run({"engine": engine, "load": {"concurrency": 1}}, requests=table).summary


def test_rejections_are_counted_by_the_limit_that_set_L():
    inputs = [50, 150, 150, 2000]
    # L = min(100, 64 x 16 = 1024) = 100: the context length rejects 150, 150 and 2000.
    by_context = replay(inputs, {"aggregated": {"context_length": 100, "num_blocks": 64, "block_size": 16}})
    assert (by_context["rejected"], by_context["rejected_context_length"], by_context["rejected_kv_capacity"]) == (3, 3, 0)
    # L = min(4096, 1024) = 1024: the KV capacity rejects 2000 only.
    by_kv = replay(inputs, {"aggregated": {"context_length": 4096, "num_blocks": 64, "block_size": 16}})
    assert (by_kv["rejected"], by_kv["rejected_context_length"], by_kv["rejected_kv_capacity"]) == (1, 0, 1)


def test_disaggregated_rejections_take_the_reason_of_the_rejecting_pool():
    # Prefill: L = 64 x 16 = 1024 (KV) rejects 2000; decode: L = min(100, 1024) = 100 rejects 150 twice.
    summary = replay([50, 150, 150, 2000], {
        "mode": "disaggregated",
        "prefill": {"num_blocks": 64, "block_size": 16},
        "decode": {"context_length": 100, "num_blocks": 64, "block_size": 16},
    })
    assert (summary["rejected"], summary["rejected_context_length"], summary["rejected_kv_capacity"]) == (3, 2, 1)


def test_the_table_shows_the_configured_percentiles_goodput_rejections_and_the_verdict():
    summary = open_loop(2 * SERVICE_RATE, percentiles=[50, 99.9], goodput={"e2el_ms": 1000.0})
    assert percentile_names(summary) == ["p50", "p99.9"]
    text = format_summary(summary, "out")
    header = next(line for line in text.splitlines() if line.startswith("Latency (ms)"))
    assert header.split() == ["Latency", "(ms)", "mean", "p50", "p99.9"]
    e2el = next(line for line in text.splitlines() if line.startswith("  E2EL"))
    assert e2el.split()[1:] == [f"{summary[k]:.2f}" for k in ("mean_e2el_ms", "p50_e2el_ms", "p99.9_e2el_ms")]
    goodput = next(line for line in text.splitlines() if line.startswith("Request goodput"))
    assert goodput.split()[-1] == f"{summary['request_goodput']:.2f}"
    assert "Saturated:" in text and f"{summary['departure_rate_second_half']:.2f} req/s" in text
    calm = format_summary(open_loop(SERVICE_RATE / 2), "out")
    assert "Saturated" not in calm and "goodput" not in calm


def test_the_table_says_why_requests_were_rejected():
    summary = replay([50, 150, 150, 2000], {"aggregated": {"context_length": 4096, "num_blocks": 64, "block_size": 16}})
    line = next(line for line in format_summary(summary, "out").splitlines() if line.startswith("Requests rejected"))
    assert line.split()[2] == "1" and line.endswith("(context length 0, KV capacity 1)")
