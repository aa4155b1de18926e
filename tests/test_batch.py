"""Batched configurations: one parallel kernel call gives exactly the one-by-one results."""

from __future__ import annotations

import dataclasses
import json

import numba
import numpy as np
import pytest

import simcore
from runners.sweep import RunnerOptions, job_points, presimulate, simulate
from simcore.config import load_config
from simcore.engine import batch as engine_batch
from simcore.engine.api import simulate_engine
from simcore.workload.api import build_requests, send_instants_ns

SMALL = {"num_requests": 40, "input_tokens": 256, "output_tokens": 16}


def _cfg(**groups) -> dict:
    cfg = {"workload": dict(SMALL), "detokenization": {"workers": 2, "base_ms": 2.85, "per_output_us": 61.6}}
    for group, values in groups.items():
        if isinstance(values, dict):
            cfg[group] = {**cfg.get(group, {}), **values}
        else:
            cfg[group] = values
    return cfg


# One shape: 40 requests of 16 outputs, one worker, detokenization in the kernel.
ONE_SHAPE = [
    _cfg(load={"concurrency": 1}),
    _cfg(load={"concurrency": 8}),
    _cfg(load={"concurrency": 16, "think_time_ms": 3.5}),
    _cfg(detokenization={"workers": 1, "base_ms": 5.0, "per_output_us": 10.0, "chunk_size": 3}),
    _cfg(detokenization={"first_output_us": 40.0, "final_output_us": 25.0}),
    _cfg(timing={"type": "linear", "base_ms": 7.0, "per_prefill_token_us": 90.0, "per_decode_seq_us": 300.0}),
    _cfg(timing={"type": "fixed", "prefill_ms": 20.0, "decode_ms": 9.0}),
    _cfg(tokenization={"workers": 2, "base_ms": 1.5, "per_input_us": 4.0}),
    _cfg(engine={"policy": "sglang"}, load={"concurrency": 8}),
    _cfg(engine={"policy": "trtllm", "aggregated": {"max_sequences": 4, "num_blocks": 64}}, load={"concurrency": 12}),
    _cfg(max_time_ms=400.0, load={"concurrency": 4}),
    # Random prompts (seeded), fixed outputs: still one shape.
    _cfg(seed=1, workload={"input_dist": "uniform", "range_ratio": 0.5}, load={"concurrency": 8}),
    _cfg(seed=2, workload={"input_dist": "uniform", "range_ratio": 0.5}, load={"concurrency": 8}),
]


def _same_summary(a: dict, b: dict) -> bool:
    return json.dumps(a, sort_keys=True, allow_nan=True) == json.dumps(b, sort_keys=True, allow_nan=True)


def _assert_same(batched, single):
    assert len(batched) == len(single)
    for i, (a, b) in enumerate(zip(batched, single)):
        assert a.requests.equals(b.requests), i
        assert a.summary == b.summary or _same_summary(a.summary, b.summary), i
        assert a.config == b.config


def test_one_shape_batch_equals_run_one_by_one():
    batched = simcore.run_batch(ONE_SHAPE)
    _assert_same(batched, [simcore.run(c) for c in ONE_SHAPE])


def test_bounded_batch_equals_run_one_by_one():
    """The bounded mode batches too; capped points (the ITL-sketch rerun) included."""
    bounded = [{**cfg, "output": {"mode": "bounded"}} for cfg in ONE_SHAPE]
    results = simcore.run_batch(bounded)
    _assert_same(results, [simcore.run(cfg) for cfg in bounded])
    capped = [r.requests.to_pydict() for r in results if r.config.max_time_ms is not None]
    assert capped
    for rows in capped:  # an incomplete request with two receipts: its gaps must stay out of ITL
        assert any(
            s == "incomplete" and first is not None and last > first
            for s, first, last in zip(rows["status"], rows["first_token_ms"], rows["last_token_ms"])
        )


def test_engine_runs_are_array_for_array_equal_and_batched_once(monkeypatch):
    calls = []
    kernel = engine_batch.nb.simulate_batch_nb
    monkeypatch.setattr(engine_batch.nb, "simulate_batch_nb", lambda *a: calls.append(a[7].send_ns.shape) or kernel(*a))
    inputs = []
    for mapping in ONE_SHAPE:
        cfg = load_config(mapping)
        rng = np.random.default_rng(cfg.seed)
        table = build_requests(cfg, None, rng)
        inputs.append((cfg, table, send_instants_ns(cfg.load, table, rng)))
    runs = engine_batch.simulate_engine_batch(*zip(*inputs))
    assert calls == [(len(ONE_SHAPE), SMALL["num_requests"])]
    for (cfg, table, send_ns), run in zip(inputs, runs):
        expected = simulate_engine(cfg, table, send_ns)
        for field in dataclasses.fields(expected):
            x, y = getattr(run, field.name), getattr(expected, field.name)
            if isinstance(y, np.ndarray):
                assert x.dtype == y.dtype and np.array_equal(x, y), field.name
            else:
                assert x == y, field.name


class _KernelCalled(Exception):
    pass


def test_a_batch_row_has_the_types_of_one_configuration(monkeypatch):
    # Both paths then run one compiled simulate_engine_nb (another type compiles the engine again).
    from simcore.engine import nb
    from simcore.engine.api import allocate_buffers, prepare

    preps = []
    for mapping in ONE_SHAPE[:2]:
        cfg = load_config(mapping)
        rng = np.random.default_rng(cfg.seed)
        table = build_requests(cfg, None, rng)
        preps.append(prepare(cfg, table, send_instants_ns(cfg.load, table, rng)))
    stacked = []

    def record(*args):
        stacked.extend(args[:-1])  # then the engine address
        raise _KernelCalled

    monkeypatch.setattr(engine_batch.nb, "simulate_batch_nb", record)
    with pytest.raises(_KernelCalled):
        engine_batch.run_prepared_batch(preps)
    prep = preps[0]
    single = prep.kernel_args(
        allocate_buffers(prep.n, prep.num_tokens, prep.pass_rows, bounded=prep.bounded), prep.prefix_cache()
    )
    assert [nb.batch_row_type(numba.typeof(a)) for a in stacked] == [numba.typeof(a) for a in single]


def test_mixed_shapes_are_grouped_and_the_rest_run_alone():
    mixed = [
        ONE_SHAPE[1],
        _cfg(workload={"num_requests": 30}),  # other n: alone
        _cfg(load={"type": "poisson", "request_rate": 50.0}),  # open loop
        _cfg(load={"type": "poisson", "request_rate": 20.0}, seed=3),
        _cfg(engine={"aggregated": {"replicas": 2}}),  # other topology: alone
        _cfg(detokenization={"base_ms": 0.0, "per_output_us": 0.0}),  # detokenization off
        _cfg(detokenization={"base_ms": 0.0, "per_output_us": 0.0}, load={"concurrency": 3}),
        _cfg(output={"passes": True, "tokens": True}),  # pass log: alone
        ONE_SHAPE[5],
        _cfg(
            engine={"mode": "disaggregated", "kv_transfer": {"bandwidth_gb_per_second": 25, "bytes_per_token": 131072}}
        ),
        _cfg(
            engine={"mode": "disaggregated", "kv_transfer": {"bandwidth_gb_per_second": 5, "bytes_per_token": 131072}},
            load={"concurrency": 4},
        ),
    ]
    batched = simcore.run_batch(mixed)
    single = [simcore.run(c) for c in mixed]
    _assert_same(batched, single)
    assert batched[7].passes.equals(single[7].passes) and batched[7].tokens.equals(single[7].tokens)


def test_a_batch_of_other_shapes_is_refused_naming_the_field():
    cfgs = [load_config(_cfg()), load_config(_cfg(workload={"output_tokens": 8}))]
    tables = [build_requests(c, None, np.random.default_rng(0)) for c in cfgs]
    with pytest.raises(ValueError, match="configuration 1 differs .* output lengths"):
        engine_batch.simulate_engine_batch(cfgs, tables)
    cfgs[1] = load_config(_cfg(engine={"aggregated": {"attention_dp": 2}}))
    with pytest.raises(ValueError, match="topology"):
        engine_batch.simulate_engine_batch(cfgs, tables[0])


def test_sweep_batch_points_are_simulated_together(tmp_path):
    # export.detailed=true: the per-token receipts are recorded for the export, not returned as tokens.
    options = RunnerOptions(batch={"load.concurrency": [1, 4, 16], "detokenization.base_ms": [1.0, 2.85]}, detailed=True)
    points = job_points(tmp_path, "job", _cfg(), [], options)
    ahead = list(presimulate(points, options))
    assert all(item is not None for item in ahead)
    for point, (result, tokens) in zip(points, ahead):
        expected, expected_tokens = simulate(load_config(point.mapping), options)
        assert result.requests.equals(expected.requests) and result.summary == expected.summary
        assert result.tokens is None and tokens.equals(expected_tokens)


def test_sweep_points_are_chunked_by_count_and_requests(tmp_path, monkeypatch):
    """presimulate cuts its chunks at BATCH_CHUNK points or BATCH_REQUESTS requests; a lone point runs alone."""
    from runners import sweep

    calls = []
    real = simcore.run_batch
    monkeypatch.setattr(sweep.simcore, "run_batch", lambda configs: calls.append(len(configs)) or real(configs))
    monkeypatch.setattr(sweep, "BATCH_CHUNK", 3)
    options = RunnerOptions(batch={"load.concurrency": [1, 2, 3, 4, 5, 6, 7]})
    points = job_points(tmp_path, "job", _cfg(), [], options)
    requests = _cfg()["workload"]["num_requests"]
    monkeypatch.setattr(sweep, "BATCH_REQUESTS", 2 * requests)  # two points' requests at most
    ahead = list(presimulate(points, options))
    assert calls == [2, 2, 2] and ahead[-1] is None  # 7 points: 2 + 2 + 2 together, the last alone
    for point, item in zip(points[:-1], ahead):
        expected, _ = simulate(load_config(point.mapping), options)
        assert item[0].requests.equals(expected.requests) and item[0].summary == expected.summary
    calls.clear()
    monkeypatch.setattr(sweep, "BATCH_REQUESTS", 100 * requests)
    ahead = list(presimulate(points, options))
    assert calls == [3, 3] and ahead[-1] is None and all(ahead[:-1])  # the seventh alone in its chunk
