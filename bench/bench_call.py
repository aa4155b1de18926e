"""Per-call overhead: CPU time of ``simulate_engine`` on a tiny configuration, this tree vs a baseline.

A 2-request closed loop (16 input / 2 output tokens, concurrency 1, linear
timing) simulates in microseconds, so a call's CPU time is nearly all its fixed
cost: preparation, buffer allocation, the kernel's dispatch (numba typing the
arguments) and the result.  Each tree (this one and ``git archive`` of
``--baseline``, default ``7df4ccd``: the commit before the typed kernel state)
runs in its own subprocess with its own numba cache; after a warm-up call each
reports the median ``time.process_time`` of ``--calls`` calls.  The trees
alternate for ``--rounds`` rounds, so that other load falls on both alike.

Output: CSV (``tree,round,median_us``), then the medians over rounds and their ratio.

Usage: python bench/bench_call.py [--rounds 5] [--calls 2000] [--baseline REV]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_trace import export_tree  # noqa: E402
from benchtime import command_env  # noqa: E402

WORKER = """
import statistics, sys, time
import numpy as np
from simcore.config import load_config
from simcore.engine.api import simulate_engine
from simcore.workload.api import build_requests

cfg = load_config({"workload": {"num_requests": 2, "input_tokens": 16, "output_tokens": 2},
                   "load": {"type": "closed_loop", "concurrency": 1}, "timing": {"type": "linear"}})
table = build_requests(cfg, None, np.random.default_rng(cfg.seed))
simulate_engine(cfg, table, None)  # JIT compile or cache load
seconds = []
for _ in range(int(sys.argv[1])):
    start = time.process_time()
    simulate_engine(cfg, table, None)
    seconds.append(time.process_time() - start)
print(statistics.median(seconds) * 1e6)
"""


def median_call_us(tree: Path, cache_dir: str, calls: int) -> float:
    env = command_env(tree, cache_dir)
    out = subprocess.run([sys.executable, "-c", WORKER, str(calls)], cwd=tree, env=env,
                         capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--baseline", default="7df4ccd")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="replaysim-call-") as work:
        trees = {"this": ROOT, args.baseline: export_tree(args.baseline, Path(work))}
        caches = {name: str(Path(work) / f"numba-{k}") for k, name in enumerate(trees)}
        for name, tree in trees.items():  # fills the numba and bytecode caches
            median_call_us(tree, caches[name], 1)
        medians: dict[str, list[float]] = {name: [] for name in trees}
        print("tree,round,median_us")
        for r in range(args.rounds):
            for name, tree in trees.items():
                medians[name].append(median_call_us(tree, caches[name], args.calls))
                print(f"{name},{r},{medians[name][-1]:.1f}", flush=True)
    this, base = (statistics.median(medians[name]) for name in trees)
    print(f"simulate_engine per call (tiny config, CPU time, median over {args.rounds} rounds): "
          f"{this:.1f} us vs {base:.1f} us at {args.baseline} (ratio {this / base:.3f})")


if __name__ == "__main__":
    main()
