"""vLLM asynchronous scheduling (engine.<pool>.async_scheduling): hand-worked light-load
timeline, the scenarios' coverage, and configuration errors.  The engine is compared
with the reference implementation in tests/test_against_reference.py."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

import simcore
from simcore.config import ConfigError, load_config
from tests.scenarios import random_scenario
from tests.test_against_reference import NUM_ASYNC_SCENARIOS, reference


def run_two_requests(async_scheduling: bool):
    """Request 0 (8 prompt tokens, 10 outputs) sent at 0 ms, request 1 (8, 1) at 5 ms;
    fixed timing: 10 ms for a pass with a prefill, + 4 ms with decodes."""
    requests = pa.table(
        {"request_id": ["a", "b"], "input_tokens": [8, 8], "output_tokens": [10, 1], "send_ms": [0.0, 5.0]}
    )
    cfg = {
        "load": {"type": "trace"},
        "workload": {"num_requests": 2},
        "engine": {"aggregated": {"async_scheduling": async_scheduling}},
        "timing": {"type": "fixed", "prefill_ms": 10.0, "decode_ms": 4.0},
        "output": {"tokens": True},
    }
    result = simcore.run(cfg, requests=requests)
    tokens = result.tokens.filter(pa.compute.equal(result.tokens["request_id"], "a"))
    return result.requests.to_pydict(), np.asarray(tokens["emitted_ms"])


def test_light_load_ttft_is_one_step_longer():
    # Synchronous: pass 1 [0, 10] prefills a; b arrives at 5 and waits; pass 2 [10, 24]
    # decodes a and prefills b (10 + 4 ms): b's TTFT = 24 - 5 = 19 ms; then a decodes
    # alone every 4 ms: its tokens at 10, 24, 28, ..., 56.
    sync, sync_a = run_two_requests(False)
    assert sync["ttft_ms"] == [10.0, 19.0]
    np.testing.assert_array_equal(sync_a, [10.0, 24.0] + [24.0 + 4 * i for i in range(1, 9)])
    # Asynchronous: at 0 the engine launches pass 1 (prefill a) and schedules pass 2 (a's
    # first decode, 4 ms) behind it; b, arriving at 5, is first seen at 10, when pass 2
    # starts and pass 3 is scheduled: [14, 28] = a's decode + b's prefill.  b's TTFT =
    # 28 - 5 = 23 ms: one (decode) step more.  a: 10, 14, 28, then every 4 ms to 56.
    asyn, async_a = run_two_requests(True)
    assert asyn["ttft_ms"] == [10.0, 23.0]
    np.testing.assert_array_equal(async_a, [10.0, 14.0, 28.0] + [28.0 + 4 * i for i in range(1, 8)])
    assert asyn["first_admit_ms"] == [0.0, 10.0]  # b is scheduled at 10, runs from 14


def test_async_scenarios_cover_the_features():
    """The async scenarios differ from the synchronous ones and include preemptions."""
    differ = preempted = 0
    for seed in range(0, NUM_ASYNC_SCENARIOS, 2):
        kwargs = dict(disaggregated=seed % 3 == 2, prefix_caching=seed % 4 == 1, allreduce=seed % 5 == 0)
        _, on = reference(random_scenario(seed, async_scheduling=True, **kwargs))
        _, off = reference(random_scenario(seed, **kwargs))
        differ += on["requests"] != off["requests"]
        preempted += any(r["num_preemptions"] > 0 for r in on["requests"])
    assert differ >= 40 and preempted >= 10, (differ, preempted)


@pytest.mark.parametrize(
    "engine, field",
    [
        ({"policy": "sglang", "aggregated": {"async_scheduling": True}}, "engine.aggregated.async_scheduling"),
        ({"policy": "trtllm", "aggregated": {"async_scheduling": True}}, "engine.aggregated.async_scheduling"),
        ({"mode": "disaggregated", "prefill": {"async_scheduling": True}}, "engine.prefill.async_scheduling"),
        ({"aggregated": {"async_scheduling": "yes"}}, "engine.aggregated.async_scheduling"),
    ],
)
def test_bad_async_config_names_the_field(engine, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        load_config({"engine": engine})
