"""First-touch cost of per-token arrays with NumPy's huge-page advice on and off.

NumPy advises the kernel to back large allocations with transparent huge
pages (``madvise(MADV_HUGEPAGE)``).  Under THP ``madvise`` mode with
``defrag=madvise`` a fault in such a region may compact memory synchronously
before it is served.  This times, per size, ``np.full(size, -1, int64)`` (the
allocation and first touch of ``token_emit_ns`` / ``token_recv_ns``) with the
advice on and off, alternating, medians of ``--runs``; with ``--run N`` also
``simcore.run`` on the reference workload's shape (closed loop, 1024/128
tokens, concurrency 256, one worker, linear timing, detokenization
``{2, 2.85, 61.6}``) at N requests, each setting in a fresh subprocess.

Output: CSV ``case,size,advice,median_s,ns_per_element``, then the THP
settings of this machine.

Usage: python bench/bench_hugepage.py [--runs 5] [--run 1000000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from numpy._core import multiarray

ROOT = Path(__file__).resolve().parents[1]
SIZES = (1 << 17, 1 << 20, 1 << 23, 1 << 25, 1 << 27)  # int64 elements: 1 MB ... 1 GB


def first_touch_seconds(size: int, advice: bool) -> float:
    previous = multiarray._set_madvise_hugepage(advice)
    try:
        start = time.perf_counter()
        array = np.full(size, -1, dtype=np.int64)
        seconds = time.perf_counter() - start
    finally:
        multiarray._set_madvise_hugepage(previous)
    del array
    return seconds


def _timed_run(requests: int, setup: str) -> float:
    """Wall seconds of one warm ``simcore.run`` in a fresh process (after a small warm-up run), ``setup`` run first."""
    code = (
        "import sys, time\n"
        "sys.path.insert(0, 'bench')\n"
        "import simcore\n"
        "import simcore.memory\n"
        "from numpy._core import multiarray\n"
        f"{setup}\n"
        "from bench_scaling import workload_config\n"
        "simcore.run(workload_config(1000))\n"
        f"config = workload_config({requests})\n"
        "start = time.perf_counter(); simcore.run(config); print(time.perf_counter() - start)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def run_seconds(requests: int, advice: bool) -> float:
    """NumPy's huge-page advice on or off for every array (``simcore.memory``'s size rule set aside)."""
    return _timed_run(requests, f"multiarray._set_madvise_hugepage({advice}); simcore.memory.NO_HUGEPAGE_BYTES = 1 << 62")


def rule_seconds(requests: int, no_hugepage_bytes: int) -> float:
    """NumPy's advice on, ``simcore.memory``'s size limit set to ``no_hugepage_bytes``."""
    return _timed_run(requests, f"simcore.memory.NO_HUGEPAGE_BYTES = {no_hugepage_bytes}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--run", type=int, default=0, help="also time simcore.run at this many requests")
    parser.add_argument("--rule", type=int, default=0,
                        help="time simcore.run at this many requests with the per-size rule against advice everywhere")
    args = parser.parse_args()
    if args.rule:
        from simcore.memory import NO_HUGEPAGE_BYTES

        rules = {"advice_everywhere": 1 << 62, "per_size": NO_HUGEPAGE_BYTES}
        samples = {name: [] for name in rules}
        for _ in range(args.runs):
            for name, limit in rules.items():
                samples[name].append(rule_seconds(args.rule, limit))
        for name in rules:
            print(f"rule,{args.rule},{name},{statistics.median(samples[name]):.3f}")
        return
    print("case,size,advice,median_s,ns_per_element")
    for size in SIZES:
        samples = {True: [], False: []}
        for _ in range(args.runs):
            for advice in (True, False):
                samples[advice].append(first_touch_seconds(size, advice))
        for advice in (True, False):
            median = statistics.median(samples[advice])
            print(f"first_touch,{size},{'on' if advice else 'off'},{median:.5f},{median / size * 1e9:.3f}")
    if args.run:
        samples = {True: [], False: []}
        for _ in range(args.runs):
            for advice in (True, False):
                samples[advice].append(run_seconds(args.run, advice))
        tokens = args.run * 128
        for advice in (True, False):
            median = statistics.median(samples[advice])
            print(f"run,{args.run},{'on' if advice else 'off'},{median:.3f},{median / tokens * 1e9:.3f}")
    for name in ("enabled", "defrag"):
        path = Path("/sys/kernel/mm/transparent_hugepage") / name
        if path.exists():
            print(f"# THP {name}: {path.read_text().strip()}")


if __name__ == "__main__":
    main()
