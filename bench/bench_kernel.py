"""Host cost of the engine kernel path on the reference workload.

Reference workload: closed loop, synthetic 1024/128 tokens, concurrency 256,
20,000 requests, one worker, KV large enough for no preemption, linear timing;
with and without detokenization {workers: 2, base_ms: 2.85, per_output_us: 61.6}.
The kernel path is ``simcore.engine.api.simulate_engine`` (JIT compile excluded
by a warm-up call).  Prints a CSV (case, requests, output_tokens, median_s,
us_per_output_token, peak_traced_mb), then the figure on the last line.

Usage: python bench/bench_kernel.py [--runs 5] [--requests 20000] [--check]
``--check`` first compares a scaled-down run (300 requests, concurrency 32)
with the pure-Python reference and prints the speed-up over it.
"""

from __future__ import annotations

import argparse
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from simcore.config import load_config  # noqa: E402
from simcore.engine.api import simulate_engine  # noqa: E402
from simcore.workload.api import build_requests  # noqa: E402
from benchtime import median_seconds  # noqa: E402  (bench/ is the script directory)

DETOK = {"workers": 2, "base_ms": 2.85, "per_output_us": 61.6}


def reference_config(num_requests: int, detokenize: bool) -> dict:
    return {
        "workload": {"num_requests": num_requests, "input_tokens": 1024, "output_tokens": 128},
        "load": {"type": "closed_loop", "concurrency": 256},
        "engine": {"aggregated": {"replicas": 1, "num_blocks": 32_768, "max_sequences": 256}},
        "timing": {"type": "linear"},
        "detokenization": DETOK if detokenize else {},
    }


def time_case(config: dict, runs: int) -> tuple[float, float, int]:
    cfg = load_config(config)
    requests = build_requests(cfg, None, np.random.default_rng(cfg.seed))
    run = simulate_engine(cfg, requests, None)  # warm-up: JIT compile or cache load
    assert run.num_preemptions.sum() == 0, "the reference workload must not preempt"
    median = median_seconds(lambda: simulate_engine(cfg, requests, None), runs)
    tracemalloc.start()
    simulate_engine(cfg, requests, None)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return median, peak / 2**20, int(run.generated.sum())


def check_against_reference() -> None:
    from tests.reference.sim import simulate
    from simcore.config import merge_config

    config = reference_config(300, True)
    config["load"]["concurrency"] = 32
    cfg = load_config(config)
    requests = build_requests(cfg, None, np.random.default_rng(cfg.seed))
    simulate_engine(cfg, requests, None)  # warm-up
    start = time.perf_counter()
    fast = simulate_engine(cfg, requests, None)
    fast_s = time.perf_counter() - start
    start = time.perf_counter()
    slow = simulate(merge_config(config), requests.request_id.to_pylist(), list(requests.input_tokens), list(requests.output_tokens), None)
    slow_s = time.perf_counter() - start
    recv = [t[1] for toks in slow["tokens"] for t in toks]
    assert recv == fast.token_recv_ns.tolist(), "kernel and reference disagree"
    print(
        f"check: kernel == reference on 300 requests; kernel {fast_s * 1e3:.2f} ms, "
        f"reference {slow_s * 1e3:.0f} ms, speed-up x{slow_s / fast_s:.0f}",
        file=sys.stderr,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    if args.check:
        check_against_reference()
    print("case,requests,output_tokens,median_s,us_per_output_token,peak_traced_mb")
    figures = {}
    for name, detokenize in (("no_detok", False), ("detok", True)):
        median, peak_mb, tokens = time_case(reference_config(args.requests, detokenize), args.runs)
        figures[name] = median / tokens * 1e6
        print(f"{name},{args.requests},{tokens},{median:.4f},{figures[name]:.4f},{peak_mb:.1f}")
    overhead = figures["detok"] / figures["no_detok"] - 1
    print(
        f"kernel path: {figures['no_detok']:.4f} us/output token without detokenization, "
        f"{figures['detok']:.4f} with ({overhead:+.1%})"
    )


if __name__ == "__main__":
    main()
