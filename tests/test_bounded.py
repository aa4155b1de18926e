"""The bounded output mode: O(requests) memory, same summary as the detailed mode.

Every summary key but the ITL median and percentiles is exactly equal in the
two modes, and so is the request table; the ITL median and percentiles come
from the log-bucket sketch, within 0.1% relative of the exact values.
"""

from __future__ import annotations

import copy
import math
import random
from fractions import Fraction

import numpy as np
import pyarrow as pa
import pytest

import simcore
from simcore.config import ConfigError
from simcore.metrics.api import requests_table
from simcore.metrics.nb import SKETCH_ALPHA, SKETCH_BUCKETS, itl_order_statistics_nb, stream_receipts_nb
from simcore.metrics.receipts import Receipts, allocate_stream_state, exact_itl_percentiles, sketch_percentiles
from tests.scenarios import random_scenario, run_fast

ITL_SKETCHED = ("median_itl_ms", "p")  # key prefixes read from the sketch (with the _itl_ms suffix)
REL_TOL = 1e-3  # the required bound; the sketch is built for SKETCH_ALPHA = 2**-11


def sketched(key: str) -> bool:
    return key.endswith("_itl_ms") and key.startswith(ITL_SKETCHED)


def assert_bounded_matches_detailed(detailed: dict, bounded: dict):
    assert list(bounded) == list(detailed)
    for key, exact in detailed.items():
        value = bounded[key]
        if sketched(key) and exact is not None:
            assert value is not None and abs(value - exact) <= REL_TOL * abs(exact), (key, value, exact)
        else:
            assert value == exact, (key, value, exact)


def with_mode(scenario: dict, mode: str) -> dict:
    scenario = copy.deepcopy(scenario)
    scenario["config"].setdefault("output", {})["mode"] = mode
    return scenario


SCENARIOS = (
    [random_scenario(seed) for seed in range(60)]
    + [random_scenario(seed, disaggregated=True) for seed in range(30)]
    + [random_scenario(seed, policy=("sglang", "trtllm")[seed % 2], long_outputs=seed % 3 == 0) for seed in range(30)]
    + [random_scenario(seed, prefix_caching=True, disaggregated=seed % 3 == 2) for seed in range(20)]
)


@pytest.mark.parametrize("index", range(len(SCENARIOS)))
def test_bounded_mode_matches_detailed_on_random_scenarios(index):
    scenario = SCENARIOS[index]
    run_d, cols_d, summary_d = run_fast(with_mode(scenario, "detailed"), record_passes=False)
    run_b, cols_b, summary_b = run_fast(with_mode(scenario, "bounded"), record_passes=False)
    assert run_b.token_recv_ns.shape == (0,) and run_b.token_emit_ns.shape == (0,)
    assert_bounded_matches_detailed(summary_d, summary_b)
    ids, inputs, outputs = scenario["ids"], np.array(scenario["inputs"]), np.array(scenario["outputs"])
    table_d = requests_table(pa.array(ids), inputs, outputs, cols_d)
    table_b = requests_table(pa.array(ids), inputs, outputs, cols_b)
    assert table_b.equals(table_d)
    # The sketch holds exactly the pooled gaps: those of completed requests.
    pooled = int(np.sum(np.maximum(cols_d.num_received - 1, 0)[cols_d.completed]))
    assert int(cols_b.receipts.itl_sketch.sum()) == pooled


def random_config(seed: int) -> dict:
    """Larger synthetic runs (hundreds to thousands of gaps), loops, caps, chunking."""
    rnd = random.Random(7000 + seed)
    output_dist = rnd.choice(["fixed", "lognormal"])
    load = rnd.choice(
        [
            {"type": "closed_loop", "concurrency": rnd.choice([1, 8, 64])},
            {"type": "poisson", "request_rate": rnd.choice([20.0, 200.0, 2000.0])},
        ]
    )
    return {
        "seed": seed,
        "workload": {
            "num_requests": rnd.randint(50, 400),
            "input_tokens": rnd.randint(16, 512),
            "output_tokens": rnd.randint(2, 64),
            "input_dist": "uniform",
            "output_dist": output_dist,
            "output_std": 8.0 if output_dist == "lognormal" else 0.0,
            "range_ratio": 0.3,
        },
        "load": load,
        "engine": {
            "policy": rnd.choice(["vllm", "sglang", "trtllm"]),
            "aggregated": {
                "replicas": rnd.randint(1, 3),
                "attention_dp": rnd.randint(1, 2),
                "max_sequences": rnd.choice([8, 64]),
                "num_blocks": rnd.choice([64, 4000]),
                "block_size": 16,
            },
        },
        "timing": {"type": "linear", "base_ms": 3.0, "per_prefill_token_us": 40.0, "per_decode_seq_us": 25.0, "per_kv_token_ns": 12.0},
        "detokenization": {
            "workers": rnd.randint(1, 3),
            "base_ms": rnd.choice([0.0, 2.85]),
            "per_output_us": rnd.choice([0.0, 61.6]),
            "chunk_size": rnd.choice([None, 8]),
        },
        "max_time_ms": rnd.choice([None, None, 1500.0]),
    }


@pytest.mark.parametrize("seed", range(30))
def test_bounded_mode_matches_detailed_through_the_api(seed):
    config = random_config(seed)
    if config["engine"]["policy"] == "sglang":
        config["engine"]["aggregated"]["chunked_prefill_size"] = 512
    detailed = simcore.run(config)
    bounded = simcore.run(copy.deepcopy(config) | {"output": {"mode": "bounded"}})
    assert_bounded_matches_detailed(detailed.summary, bounded.summary)
    assert bounded.requests.equals(detailed.requests)


def test_capped_bounded_run_sketches_only_completed_requests():
    """A time cap leaves requests with gaps incomplete; their gaps stay out of ITL."""
    config = random_config(0) | {"max_time_ms": 1500.0, "load": {"type": "closed_loop", "concurrency": 16}}
    config["workload"] |= {"num_requests": 200, "output_tokens": 40, "output_dist": "fixed", "output_std": 0.0}
    detailed = simcore.run(config)
    bounded = simcore.run(copy.deepcopy(config) | {"output": {"mode": "bounded"}})
    assert detailed.summary["incomplete"] > 0 and detailed.summary["completed"] > 0
    generated = detailed.requests.column("generated_tokens").to_numpy()
    incomplete = np.array(detailed.requests.column("status").to_pylist()) == "incomplete"
    assert (generated[incomplete] >= 3).any()  # their gaps could have leaked into the sketch
    assert_bounded_matches_detailed(detailed.summary, bounded.summary)


def test_gap_squares_are_exact_beyond_64_bits():
    """Per-request sums of squared gaps (ns^2) against Python integers, gaps up to 2^40 ns."""
    rng = np.random.default_rng(3)
    lengths = rng.integers(1, 50, size=40)
    offset = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
    scale = rng.choice([1, 2**20, 2**33, 2**40], size=offset[-1])
    gaps = (rng.random(offset[-1]) * scale).astype(np.int64)
    recv = np.cumsum(gaps).astype(np.int64)
    receipts = Receipts.from_tokens(offset, recv)
    for k in range(40):
        tokens = [int(x) for x in recv[offset[k] : offset[k + 1]]]
        squares = sum((b - a) ** 2 for a, b in zip(tokens, tokens[1:]))
        assert (int(receipts.gap_sq_hi[k]) << 62) + int(receipts.gap_sq_lo[k]) == squares
        assert 0 <= receipts.gap_sq_lo[k] < 2**62
        if len(tokens) >= 2:
            diffs = [b - a for a, b in zip(tokens, tokens[1:])]
            assert (receipts.gap_min_ns[k], receipts.gap_max_ns[k]) == (min(diffs), max(diffs))
        else:
            assert (receipts.gap_min_ns[k], receipts.gap_max_ns[k]) == (-1, -1)


def test_itl_std_is_the_exact_population_std():
    """Mean and std of ITL from exact integer sums, checked against fractions of the gaps."""
    result = simcore.run(random_config(3) | {"output": {"tokens": True}})
    received = {}
    status = dict(zip(result.requests.column("request_id").to_pylist(), result.requests.column("status").to_pylist()))
    for row in result.tokens.to_pylist():
        if status[row["request_id"]] == "completed":
            received.setdefault(row["request_id"], []).append(round(row["received_ms"] * 1e6))
    gaps = [b - a for times in received.values() for a, b in zip(times, times[1:])]
    n = len(gaps)
    mean = Fraction(sum(gaps), n)
    variance = sum((Fraction(g) - mean) ** 2 for g in gaps) / n
    assert result.summary["mean_itl_ms"] == float(mean / 10**6)
    assert math.isclose(result.summary["std_itl_ms"], math.sqrt(variance) / 1e6, rel_tol=1e-15)


@pytest.mark.parametrize("shape", ["lognormal", "bimodal", "ties"])
def test_sketch_percentiles_within_alpha(shape):
    """Percentiles read from the sketch of heavy-tailed, bimodal and tied gaps vs numpy's."""
    rng = np.random.default_rng(11)
    m = 20_000
    if shape == "lognormal":
        gaps = np.exp(rng.normal(15, 2.0, m)).astype(np.int64)
    elif shape == "bimodal":
        gaps = np.where(rng.random(m) < 0.9, rng.integers(8_000_000, 9_000_000, m), rng.integers(100_000_000, 300_000_000, m))
    else:
        gaps = rng.choice([0, 0, 1, 2, 5_000_000], size=m)
    state = allocate_stream_state(1)
    recv = np.concatenate(([0], np.cumsum(gaps))).astype(np.int64)
    one = np.zeros(1, dtype=np.int64)
    for end in recv:  # one receipt per pass, as the kernel folds them
        stream_receipts_nb(1, one, np.array([end]), np.iinfo(np.int64).max, state)
    sketch = state[-1]
    assert sketch.shape == (SKETCH_BUCKETS,) and sketch.sum() == m
    qs = [0, 1, 10, 25, 50, 75, 90, 95, 99, 99.9, 100]
    exact = np.percentile(gaps / 1e6, qs)
    approx = sketch_percentiles(sketch, qs, gaps.min() / 1e6, gaps.max() / 1e6)
    for q, e, a in zip(qs, exact, approx):
        assert abs(a - e) <= SKETCH_ALPHA * (1 + 1e-9) * abs(e), (q, a, e)


def test_bounded_mode_refuses_the_token_table():
    with pytest.raises(ConfigError, match="output.tokens"):
        simcore.run({"output": {"mode": "bounded", "tokens": True}})


def test_scenarios_exercise_the_itl_rerun():
    """Some scenarios leave requests with gaps incomplete (the bounded mode's second run)."""
    count = 0
    for scenario in SCENARIOS:
        _, cols, _ = run_fast(with_mode(scenario, "detailed"), record_passes=False)
        count += bool(np.any(~cols.completed & (cols.num_received >= 2)))
    assert count >= 10


@pytest.mark.parametrize("scale", [1, 2**20, 2**36])
def test_order_statistics_select_exactly(scale):
    """Radix selection of pooled gaps (one, two and three levels) against a sort."""
    rng = np.random.default_rng(scale)
    lengths = rng.integers(1, 60, size=300)
    offset = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
    gaps = (rng.random(offset[-1]) ** 3 * scale * 1000).astype(np.int64)
    gaps[rng.random(offset[-1]) < 0.2] = 0  # ties and zero gaps, as detokenizer chunks give
    recv = np.cumsum(gaps).astype(np.int64)
    receipts = Receipts.from_tokens(offset, recv)
    include = rng.random(300) < 0.8
    pooled = np.sort(np.concatenate([np.diff(recv[offset[k] : offset[k + 1]]) for k in range(300) if include[k]]))
    ranks = np.unique(np.concatenate(([0, pooled.size - 1], rng.integers(0, pooled.size, 20))))
    out = np.empty(ranks.size, dtype=np.int64)
    itl_order_statistics_nb(offset, recv, receipts.num_received, include, int(pooled[-1]), ranks, out)
    assert out.tolist() == pooled[ranks].tolist()
    qs = [0, 12.5, 50, 90, 99, 99.9, 100]
    assert exact_itl_percentiles(offset, recv, receipts, include, pooled.size, qs) == np.percentile(pooled / 1e6, qs).tolist()


@pytest.mark.parametrize("mode", ["detailed", "bounded"])
def test_progress_reports_finished_requests_without_changing_results(mode):
    config = random_config(5) | {"output": {"mode": mode}, "max_time_ms": None}
    calls = []
    watched = simcore.run(config, progress=lambda done, total: calls.append((done, total)))
    plain = simcore.run(config)
    assert watched.requests.equals(plain.requests) and watched.summary == plain.summary
    n = plain.summary["num_requests"]
    assert calls and all(total == n for _, total in calls)
    done = [d for d, _ in calls]
    assert done == sorted(done) and done[-1] == plain.summary["completed"] + plain.summary["rejected"] == n
