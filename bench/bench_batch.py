"""Batched configurations: configurations per second, one parallel kernel call vs a loop.

Workload: 100-request closed-loop runs (synthetic 1024/128 tokens, one worker,
linear timing), ``--configs`` configurations (default 400) that vary the
concurrency (8 .. 32 around 16) and the detokenizer costs (workers 2, base_ms
and per_output_us on a grid), all of one shape.  Cases:

* ``run_batch`` / ``run_loop``: ``simcore.run_batch(configs)`` vs
  ``[simcore.run(c) for c in configs]``, end to end from config mappings
  (validation, workload, kernel, request tables and summaries).
* ``engine_batch`` / ``engine_loop``: the engine path alone on prepared
  configurations and request tables: ``simulate_engine_batch`` (one
  ``prange`` kernel call) vs a loop over ``simulate_engine``.
* ``reference_sim`` / ``reference_sim+summary``: the pure-Python reference
  (``tests/reference``: ``sim.simulate``, plus ``metrics.summarize``, as in
  ``bench_scaling.py``) on the first ``--reference-configs`` configurations
  (default 25: one full cycle of the concurrencies), same requests and send
  pattern as ``simcore.run``; the ``speedup_vs_reference`` column is a case's
  configurations per second over the reference's (``run_*`` vs simulate +
  summary, ``engine_*`` vs simulate alone).

Before timing, every reference configuration is checked against the fast
paths: each request's instants and every token receipt from
``simulate_engine_batch``, the first/last receipts and the summary from
``simcore.run_batch`` (and ``simcore.run`` on the first); any difference stops
the script.

JIT compile and cache load are excluded by a warm-up call; each case reports
the median of ``--runs``.  Threads: ``NUMBA_NUM_THREADS`` (the batch kernel's
prange).  Prints a CSV (case, configs, median_s, configs_per_s,
speedup_vs_reference), then the figure on the last line.

Usage: python bench/bench_batch.py [--runs 5] [--configs 400] [--reference-configs 25]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numba
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import simcore  # noqa: E402
from simcore.config import load_config, merge_config  # noqa: E402
from simcore.engine.api import simulate_engine  # noqa: E402
from simcore.engine.batch import simulate_engine_batch  # noqa: E402
from simcore.metrics.api import RequestColumns  # noqa: E402
from simcore.workload.api import build_requests, send_instants_ns  # noqa: E402
from benchtime import median_seconds  # noqa: E402  (bench/ is the script directory)


def configs(count: int) -> list[dict]:
    out = []
    for i in range(count):
        out.append({
            "workload": {"num_requests": 100, "input_tokens": 1024, "output_tokens": 128},
            "load": {"type": "closed_loop", "concurrency": 8 + (i % 25)},
            "timing": {"type": "linear"},
            "detokenization": {
                "workers": 2,
                "base_ms": 0.5 + 0.25 * ((i // 25) % 16),
                "per_output_us": 20.0 + 5.0 * (i % 9),
            },
        })
    return out


def reference_inputs(mapping: dict) -> dict:
    """The pure-Python reference's arguments for one configuration: the request
    table and send instants built as ``simcore.run`` builds them."""
    cfg = load_config(mapping)
    rng = np.random.default_rng(cfg.seed)
    table = build_requests(cfg, None, rng)
    send_ns = send_instants_ns(cfg.load, table, rng)
    full = merge_config(mapping)
    return {
        "cfg": cfg,
        "table": table,
        "send_ns": send_ns,
        "config": full,
        "args": (table.request_id.to_pylist(), list(table.input_tokens), list(table.output_tokens),
                 None if send_ns is None else send_ns.tolist()),
        "cap_ns": None if full["max_time_ms"] is None else round(full["max_time_ms"] * 1e6),
    }


#: Summary keys of ``simcore.run`` outside the reference's summary: trace rows dropped
#: by the reader, rejections by limit, the saturation verdict (docs/metrics.md; the
#: verdict's laws are tested in tests/test_summary_verdicts.py).
RUN_ONLY_KEYS = ("dropped_requests", "rejected_context_length", "rejected_kv_capacity",
                 "saturated", "arrival_rate_second_half", "departure_rate_second_half")


def check_against_reference(mappings: list[dict], refs: list[dict]) -> None:
    """Fast paths == pure-Python reference on ``mappings`` (request instants and token
    receipts to the nanosecond, summaries as tests/test_against_reference.py); raises if not."""
    from tests.reference.metrics import summarize as reference_summarize
    from tests.reference.sim import simulate
    from tests.scenarios import fast_as_reference
    from tests.test_against_reference import REQUEST_KEYS, assert_summaries_equal

    engines = simulate_engine_batch([r["cfg"] for r in refs], [r["table"] for r in refs], [r["send_ns"] for r in refs])
    results = simcore.run_batch(mappings)
    single = simcore.run(mappings[0])
    for k, (ref, engine, result) in enumerate(zip(refs, engines, results)):
        slow = simulate(ref["config"], *ref["args"])
        m = ref["config"]["metrics"]
        slow_summary = reference_summarize(slow, ref["args"][1], ref["args"][2], m["percentiles"], m["goodput"], ref["cap_ns"])
        fast = fast_as_reference(engine, RequestColumns(engine))
        for i, (f, s) in enumerate(zip(fast["requests"], slow["requests"])):
            if {key: f[key] for key in REQUEST_KEYS} != {key: s[key] for key in REQUEST_KEYS}:
                raise SystemExit(f"check failed: configuration {k}, request {i}: engine batch {f} != reference {s}")
        if fast["tokens"] != slow["tokens"]:
            raise SystemExit(f"check failed: configuration {k}: engine batch token receipts differ from the reference")
        for column, key in (("first_token_ms", "first_recv_ns"), ("last_token_ms", "last_recv_ns")):
            got = result.requests.column(column).to_numpy(zero_copy_only=False)
            want = np.array([np.nan if r[key] is None else r[key] / 1e6 for r in slow["requests"]])
            if not np.array_equal(got, want, equal_nan=True):
                raise SystemExit(f"check failed: configuration {k}: run_batch {column} differs from the reference")
        summaries = [("run_batch", result.summary)] + ([("run", single.summary)] if k == 0 else [])
        for name, summary in summaries:
            # simcore.run adds keys the reference's summary (SPEC §10) has no counterpart
            # for: compare the rest, the rejection reasons by their sum (conservation)
            extras = {key: summary[key] for key in RUN_ONLY_KEYS}
            summary = {key: value for key, value in summary.items() if key not in RUN_ONLY_KEYS}
            try:
                assert_summaries_equal(summary, slow_summary)
                assert extras["dropped_requests"] == 0, "dropped_requests"  # generated workload
                rejected = extras["rejected_context_length"] + extras["rejected_kv_capacity"]
                assert rejected == slow_summary["rejected"], "rejected_context_length + rejected_kv_capacity"
            except AssertionError as error:
                raise SystemExit(f"check failed: configuration {k}: {name} summary differs from the reference: {str(error) or 'different keys'}")
    print(
        f"check: engine batch, run_batch and run == pure-Python reference on {len(refs)} configurations "
        f"(request instants, {sum(len(t) for t in slow['tokens'])} token receipts each, summaries)",
        file=sys.stderr,
    )


def time_reference(refs: list[dict], runs: int) -> tuple[float, float]:
    """Median seconds of the reference over ``refs``: simulate, and simulate + summary."""
    from tests.reference.metrics import summarize as reference_summarize
    from tests.reference.sim import simulate

    def slow_sim():
        return [simulate(r["config"], *r["args"]) for r in refs]

    slows = slow_sim()

    def slow_summary():
        for r, slow in zip(refs, slows):
            m = r["config"]["metrics"]
            reference_summarize(slow, r["args"][1], r["args"][2], m["percentiles"], m["goodput"], r["cap_ns"])

    sim_s = median_seconds(slow_sim, runs)
    return sim_s, sim_s + median_seconds(slow_summary, runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--configs", type=int, default=400)
    parser.add_argument("--reference-configs", type=int, default=25,
                        help="first configurations also run by the pure-Python reference")
    args = parser.parse_args()

    mappings = configs(args.configs)
    n_ref = max(1, min(args.reference_configs, args.configs))
    refs = [reference_inputs(m) for m in mappings[:n_ref]]
    check_against_reference(mappings[:n_ref], refs)
    ref_sim_s, ref_total_s = time_reference(refs, args.runs)
    ref_rate = {"reference_sim": n_ref / ref_sim_s, "reference_sim+summary": n_ref / ref_total_s}
    cfgs = [load_config(m) for m in mappings]
    tables = [build_requests(c, None, np.random.default_rng(c.seed)) for c in cfgs]
    cases = {
        "run_batch": lambda: simcore.run_batch(mappings),
        "run_loop": lambda: [simcore.run(m) for m in mappings],
        "engine_batch": lambda: simulate_engine_batch(cfgs, tables),
        "engine_loop": lambda: [simulate_engine(c, t, None) for c, t in zip(cfgs, tables)],
    }
    rate = {}
    print("case,configs,median_s,configs_per_s,speedup_vs_reference")
    for name, fn in cases.items():
        median = median_seconds(fn, args.runs, warm_up=True)
        rate[name] = args.configs / median
        ref_key = "reference_sim+summary" if name.startswith("run_") else "reference_sim"
        print(f"{name},{args.configs},{median:.4f},{rate[name]:.1f},{rate[name] / ref_rate[ref_key]:.0f}")
    for name, seconds in (("reference_sim", ref_sim_s), ("reference_sim+summary", ref_total_s)):
        print(f"{name},{n_ref},{seconds:.4f},{ref_rate[name]:.1f},")
    speedup = rate["run_batch"] / ref_rate["reference_sim+summary"]
    print(
        f"batched configurations ({numba.config.NUMBA_NUM_THREADS} numba threads, 100-request closed loops): "
        f"run_batch {rate['run_batch']:.0f} configs/s vs run loop {rate['run_loop']:.0f} "
        f"({rate['run_batch'] / rate['run_loop']:.2f}x); engine batch {rate['engine_batch']:.0f} vs loop "
        f"{rate['engine_loop']:.0f} configs/s ({rate['engine_batch'] / rate['engine_loop']:.2f}x); "
        f"run_batch x{speedup:.0f} vs the pure-Python reference ({ref_rate['reference_sim+summary']:.1f} configs/s, "
        f"simulate + summary, first {n_ref} configurations)"
    )


if __name__ == "__main__":
    main()
