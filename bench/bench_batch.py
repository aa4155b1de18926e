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

JIT compile and cache load are excluded by a warm-up call; each case reports
the median of ``--runs``.  Threads: ``NUMBA_NUM_THREADS`` (the batch kernel's
prange).  Prints a CSV (case, configs, median_s, configs_per_s), then the
figure on the last line.

Usage: python bench/bench_batch.py [--runs 5] [--configs 400]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numba
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import simcore  # noqa: E402
from simcore.config import load_config  # noqa: E402
from simcore.engine.api import simulate_engine  # noqa: E402
from simcore.engine.batch import simulate_engine_batch  # noqa: E402
from simcore.workload.api import build_requests  # noqa: E402
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--configs", type=int, default=400)
    args = parser.parse_args()

    mappings = configs(args.configs)
    cfgs = [load_config(m) for m in mappings]
    tables = [build_requests(c, None, np.random.default_rng(c.seed)) for c in cfgs]
    cases = {
        "run_batch": lambda: simcore.run_batch(mappings),
        "run_loop": lambda: [simcore.run(m) for m in mappings],
        "engine_batch": lambda: simulate_engine_batch(cfgs, tables),
        "engine_loop": lambda: [simulate_engine(c, t, None) for c, t in zip(cfgs, tables)],
    }
    rate = {}
    print("case,configs,median_s,configs_per_s")
    for name, fn in cases.items():
        median = median_seconds(fn, args.runs, warm_up=True)
        rate[name] = args.configs / median
        print(f"{name},{args.configs},{median:.4f},{rate[name]:.1f}")
    print(
        f"batched configurations ({numba.config.NUMBA_NUM_THREADS} numba threads, 100-request closed loops): "
        f"run_batch {rate['run_batch']:.0f} configs/s vs run loop {rate['run_loop']:.0f} "
        f"({rate['run_batch'] / rate['run_loop']:.2f}x); engine batch {rate['engine_batch']:.0f} vs loop "
        f"{rate['engine_loop']:.0f} configs/s ({rate['engine_batch'] / rate['engine_loop']:.2f}x)"
    )


if __name__ == "__main__":
    main()
