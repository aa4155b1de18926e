"""Capacity search: wall time of a full bisection over many configurations, per probe, and the kernel's share.

Workload: 2,000 synthetic requests of 1024/128 tokens per run, Poisson arrivals,
one worker, linear timing; SLO p99 TTFT <= 500 ms and p99 TPOT <= 50 ms; axis
``load.request_rate`` from 1 req/s by doubling, relative tolerance 0.01, one
seed.  The configurations vary ``max_batched_tokens`` (2048 .. 16384),
``max_sequences`` (64 .. 1024) and ``timing.per_decode_seq_us`` (10 .. 50), all
of one shape, so each bisection step is one ``prange`` kernel call
(``NUMBA_NUM_THREADS`` threads).  ``--configs`` sets how many (default 100;
the first N of a 4 x 5 x 50 grid, the last axis cycling through
``per_decode_seq_us``).

Runs :func:`runners.capacity.bisect_all` as the command does (no files: the
probe store is in memory), after a warm-up search of 2 configurations (numba
compile or cache load excluded).  The kernel time is the wall time inside the
batched kernel (``simcore.engine.nb.simulate_batch_nb``, wrapped by a timer
here) and the single-configuration kernel (``simulate_engine_nb``); the rest —
validation, workload generation, padding, request tables, summaries, SLO
judgement — is outside it.

Prints a CSV (configs, probes, runs, steps, seconds, cpu_seconds (of the
process, all threads: on a shared machine the wall time also holds waits for a
core), ms_per_probe, kernel_seconds, outside_kernel_share), then the figure on
the last line.

Usage: python bench/bench_capacity.py [--configs 100]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runners import capacity as cap  # noqa: E402
from simcore.config import load_config  # noqa: E402
from simcore.engine import nb  # noqa: E402

BASE = {
    "workload": {"num_requests": 2000, "input_tokens": 1024, "output_tokens": 128},
    "load": {"type": "poisson", "request_rate": 1.0},
}
CAPACITY = {"axis": "load.request_rate", "tolerance": 0.01, "slo": {"p99_ttft_ms": 500, "p99_tpot_ms": 50}}


def grid(count: int) -> list[dict]:
    """``count`` configurations of one shape (see the module docstring)."""
    budgets, sequences = (2048, 4096, 8192, 16384), (64, 128, 256, 512, 1024)
    per_seq = [10 + 40 * i / 49 for i in range(50)]
    out = []
    combos = [(t, s, u) for u in per_seq for t in budgets for s in sequences][:count]
    for tokens, seqs, us in combos:
        out.append({
            **BASE,
            "engine": {"aggregated": {"max_batched_tokens": tokens, "max_sequences": seqs}},
            "timing": {"type": "linear", "per_decode_seq_us": us},
        })
    return out


class KernelClock:
    """Wraps the kernels of ``simcore.engine.nb`` with a wall-time accumulator."""

    NAMES = ("simulate_batch_nb", "simulate_engine_nb")

    def __init__(self):
        self.seconds = 0.0
        self._original = {name: getattr(nb, name) for name in self.NAMES if hasattr(nb, name)}
        for name, kernel in self._original.items():
            setattr(nb, name, self._timed(kernel))

    def _timed(self, kernel):
        def call(*args):
            start = time.perf_counter()
            try:
                return kernel(*args)
            finally:
                self.seconds += time.perf_counter() - start

        return call


def search(mappings: list[dict]) -> tuple[list, cap.ProbeStore, int]:
    options = cap.parse_options(CAPACITY)
    store = cap.ProbeStore(None)  # in memory: no probe files
    steps = 0

    def on_step(done: int, total: int) -> None:
        nonlocal steps
        steps += 1

    configs = [(m, load_config(m)) for m in mappings]
    brackets = cap.bisect_all(configs, options, store, on_step)
    return brackets, store, steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", type=int, default=100)
    args = parser.parse_args()
    search(grid(2))  # warm-up: compile or load the kernels
    clock = KernelClock()
    mappings = grid(args.configs)
    start, cpu_start = time.perf_counter(), time.process_time()
    brackets, store, steps = search(mappings)
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    probes = sum(len(b.probes) for b in brackets)
    runs = len(store.summaries)
    outside = 1.0 - clock.seconds / seconds
    statuses = {s: sum(b.status == s for b in brackets) for s in {b.status for b in brackets}}
    print("configs,probes,runs,steps,seconds,cpu_seconds,ms_per_probe,kernel_seconds,outside_kernel_share")
    print(f"{args.configs},{probes},{runs},{steps},{seconds:.2f},{cpu_seconds:.2f},{1000 * seconds / probes:.2f},"
          f"{clock.seconds:.2f},{outside:.3f}")
    capacities = [b.capacity for b in brackets if b.capacity is not None]
    print(f"# statuses {statuses}; capacity {min(capacities):.3g}..{max(capacities):.3g} req/s")
    print(f"{args.configs} configurations x full bisection of 2,000-request runs: {seconds:.1f} s, "
          f"{1000 * seconds / probes:.1f} ms per probe, {outside:.0%} outside the kernel")


if __name__ == "__main__":
    main()
