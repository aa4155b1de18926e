"""Host µs per output token with prefix caching on and off, against a baseline commit.

Issue 16, part 1: on the Mooncake conversation trace
(``../shared/data/mooncake/conversation_trace.jsonl``, 12,031 requests, sent at
its timestamps), over 1 and 4 aggregated workers (vllm unless ``--policy`` says otherwise) (linear timing, every
other key at its default), ``simcore.run`` end to end with
``engine.aggregated.prefix_caching`` on and off, side by side.  Cases:
``first_2000`` (the trace's first 2,000 rows) and ``full``.

Both trees (this checkout and ``git archive`` of ``--baseline``, default
``main``) run in their own long-lived worker process, each warmed up once per
configuration (JIT compile or numba cache load excluded); the parent asks for
one timed run at a time, interleaved (every configuration of both trees once
per round), so load from other users of the machine falls on all alike.  Each
figure is the median of ``--runs`` runs' CPU time; the baseline's prefix-caching runs
of the full trace take about a minute each, so ``--baseline-full-runs``
(default 1) bounds them.  Both trees must give the same summary (checked on
every run: hit rate, output tokens, duration, mean TTFT and ITL).

Output: CSV ``case,workers,prefix_caching,tree,output_tokens,median_s,us_per_output_token,on_over_off,vs_baseline``
(``on_over_off``: the median with prefix caching over the median without it,
same tree, case and workers; ``vs_baseline``: this tree's median over the
baseline's), headline on the last line (target: ``on_over_off`` <= 2).

``--policy`` (default ``vllm``) and ``--block-size`` (default: the policy's)
set ``engine.policy`` and ``engine.aggregated.block_size`` for every run; ``--workers``
picks the worker counts (default ``1,4``).

Usage: python bench/bench_prefix.py [--runs 5] [--baseline REV] [--cases first_2000,full] [--baseline-full-runs 1]
       [--policy vllm|sglang|trtllm] [--block-size N] [--workers 1,4]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT.parent / "shared" / "data" / "mooncake" / "conversation_trace.jsonl"
CASES = {"first_2000": 2000, "full": None}
WORKERS = (1, 4)
CHECKED = ("prefix_cache_hit_rate", "total_output_tokens", "duration_s", "mean_ttft_ms", "mean_itl_ms")
TARGET = 2.0


def config(max_requests: int | None, workers: int, prefix_caching: bool, policy: str = "vllm",
           block_size: int | None = None) -> dict:
    pool = {"replicas": workers, "prefix_caching": prefix_caching}
    if block_size is not None:
        pool["block_size"] = block_size
    return {
        "seed": 0,
        "workload": {"source": "mooncake", "path": str(TRACE), "num_requests": None, "max_requests": max_requests},
        "load": {"type": "trace"},
        "timing": {"type": "linear"},
        "engine": {"policy": policy, "aggregated": pool},
    }


def worker() -> None:
    """Serve timing requests on stdin: one JSON line ``[key, config]`` -> ``[seconds, summary values]``."""
    import time

    import simcore

    warmed = set()
    for line in sys.stdin:
        key, cfg = json.loads(line)
        if key not in warmed:
            simcore.run(cfg)
            warmed.add(key)
        start = time.process_time()  # CPU time: a busy machine's waits for a core do not count
        result = simcore.run(cfg)
        seconds = time.process_time() - start
        print(json.dumps([seconds, [result.summary[name] for name in CHECKED]]), flush=True)


def start_worker(tree: Path) -> subprocess.Popen:
    """This script's worker, importing ``simcore`` from ``tree``."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    return subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "--worker"],
        cwd=tree, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )


def ask(proc: subprocess.Popen, key: str, cfg: dict) -> tuple[float, list]:
    proc.stdin.write(json.dumps([key, cfg]) + "\n")
    proc.stdin.flush()
    seconds, values = json.loads(proc.stdout.readline())
    return seconds, values


def main() -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    from bench_trace import export_tree

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--baseline", default="main")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--baseline-full-runs", type=int, default=1)
    parser.add_argument("--policy", default="vllm", choices=("vllm", "sglang", "trtllm"))
    parser.add_argument("--block-size", type=int, default=None)
    parser.add_argument("--workers", default=",".join(map(str, WORKERS)))
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker()
        return
    configs = {
        (case, workers, on): config(CASES[case], workers, on, args.policy, args.block_size)
        for case in args.cases.split(",") for workers in map(int, args.workers.split(",")) for on in (False, True)
    }
    samples: dict[tuple, list[float]] = {}
    summaries: dict[tuple, list] = {}
    with tempfile.TemporaryDirectory() as tmp:
        base = export_tree(args.baseline, Path(tmp))
        procs = {"head": start_worker(ROOT), "base": start_worker(base)}
        for round_ in range(args.runs):
            for key, cfg in configs.items():
                for tree, proc in procs.items():
                    slow = tree == "base" and key[0] == "full" and key[2]
                    if slow and round_ >= args.baseline_full_runs:
                        continue
                    seconds, values = ask(proc, repr(key), cfg)
                    samples.setdefault((*key, tree), []).append(seconds)
                    if summaries.setdefault(key, values) != values:
                        raise SystemExit(f"{key}: the trees' summaries differ: {summaries[key]} vs {values}")
        for proc in procs.values():
            proc.stdin.close()
            proc.wait()
    medians = {job: statistics.median(s) for job, s in samples.items()}
    print("case,workers,prefix_caching,tree,output_tokens,median_s,us_per_output_token,on_over_off,vs_baseline")
    headline = []
    for (case, workers, on, tree), median in medians.items():
        tokens = summaries[(case, workers, on)][CHECKED.index("total_output_tokens")]
        on_over_off = median / medians[(case, workers, False, tree)]
        vs_base = median / medians[(case, workers, on, "base")] if tree == "head" else 1.0
        print(f"{case},{workers},{on},{tree},{tokens},{median:.4f},{median / tokens * 1e6:.4f},{on_over_off:.2f},{vs_base:.3f}")
        if on and tree == "head":
            base_ratio = medians[(case, workers, True, "base")] / medians[(case, workers, False, "base")]
            headline.append(
                f"{case} x{workers}: on/off {on_over_off:.2f} (target <= {TARGET:g}; {args.baseline} {base_ratio:.1f})"
            )
    print("; ".join(headline))


if __name__ == "__main__":
    main()
