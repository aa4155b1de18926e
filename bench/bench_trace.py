"""Host µs per output token on light trace load, interleaved against a baseline commit.

Workloads (issue 14), all ``simcore.run`` end to end, one vllm worker, linear
timing, detokenization {workers: 2, base_ms: 2.85, per_output_us: 61.6}:

- ``trace_x1``: the first 4,096 rows of the Azure conversation trace
  (``../shared/data/azure-llm-2023/AzureLLMInferenceTrace_conv.csv``) as recorded;
- ``trace_x4``: the same with the gaps stretched x4 (``load.speedup=0.25``);
- ``reference``: the reference workload of ``bench_scaling.py`` (closed loop,
  1024/128 tokens, concurrency 256, 20,000 requests).

Both trees (this checkout and ``git archive`` of ``--baseline``, default
``HEAD~1``) run in their own long-lived worker process, each warmed up once per
workload (JIT compile or numba cache load excluded); the parent then asks them
for one timed run at a time, alternating, so load from other users of the
machine falls on both alike.  Each figure is the median of ``--runs`` runs'
CPU time (``time.process_time``: the time spent waiting for a core on a busy
machine is not counted).

Output: CSV ``case,tree,output_tokens,median_s,us_per_output_token,ratio``
(ratio: this tree's median over the baseline's), headline on the last line.

``--baseline-env NAME=VALUE`` makes the baseline this tree run with that
environment instead (``NUMBA_CPU_NAME=generic``: a portable CPU target).

Usage: python bench/bench_trace.py [--runs 7] [--baseline REV] [--baseline-env NAME=VALUE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT.parent / "shared" / "data" / "azure-llm-2023" / "AzureLLMInferenceTrace_conv.csv"
DETOK = {"workers": 2, "base_ms": 2.85, "per_output_us": 61.6}
TARGET_US = {"trace_x1": 0.04, "trace_x4": 0.06, "reference": 0.02}


def trace_config(speedup: float) -> dict:
    return {
        "seed": 0,
        "workload": {"source": "azure", "path": str(TRACE), "num_requests": None, "max_requests": 4096},
        "load": {"type": "trace", "speedup": speedup},
        "timing": {"type": "linear"},
        "detokenization": DETOK,
    }


def reference_config() -> dict:
    sys.path.insert(0, str(ROOT / "bench"))
    from bench_scaling import workload_config

    return workload_config(20_000)


def worker() -> None:
    """Serve timing requests on stdin: one JSON line ``[case, config]`` -> seconds."""
    import simcore

    warmed = set()
    for line in sys.stdin:
        case, config = json.loads(line)
        if case not in warmed:
            simcore.run(config)
            warmed.add(case)
        start = time.process_time()  # CPU time: a busy machine's waits for a core do not count
        result = simcore.run(config)
        seconds = time.process_time() - start
        print(json.dumps([seconds, result.summary["total_output_tokens"]]), flush=True)


def start_worker(tree: Path, extra_env: dict[str, str] | None = None) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(tree), **(extra_env or {}))
    return subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "--worker"],
        cwd=tree, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )


def ask(proc: subprocess.Popen, case: str, config: dict) -> tuple[float, int]:
    proc.stdin.write(json.dumps([case, config]) + "\n")
    proc.stdin.flush()
    seconds, tokens = json.loads(proc.stdout.readline())
    return seconds, tokens


def export_tree(rev: str, into: Path) -> Path:
    archive = into / "tree.tar"
    with open(archive, "wb") as fh:
        subprocess.run(["git", "archive", rev], cwd=ROOT, stdout=fh, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into / "tree", filter="data")
    return into / "tree"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--baseline", default="HEAD~1")
    parser.add_argument("--cases", default="trace_x1,trace_x4,reference")
    parser.add_argument("--baseline-env", metavar="NAME=VALUE", action="append", default=[],
                        help="instead of a commit, the baseline is this tree with these environment variables "
                             "(e.g. NUMBA_CPU_NAME=generic: kernels compiled for a portable CPU target)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker()
        return
    all_configs = {"trace_x1": trace_config(1.0), "trace_x4": trace_config(0.25), "reference": reference_config()}
    configs = {name: all_configs[name] for name in args.cases.split(",")}
    with tempfile.TemporaryDirectory() as tmp:
        if args.baseline_env:
            base_env = dict(item.split("=", 1) for item in args.baseline_env)
            args.baseline = " ".join(args.baseline_env)
            procs = {"head": start_worker(ROOT), "base": start_worker(ROOT, base_env)}
        else:
            procs = {"head": start_worker(ROOT), "base": start_worker(export_tree(args.baseline, Path(tmp)))}
        jobs = [(case, tree) for case in configs for tree in procs]
        samples: dict[tuple, list[float]] = {job: [] for job in jobs}
        tokens: dict[tuple, int] = {}
        for _ in range(args.runs):
            for job in jobs:  # interleaved: one run of each job per round
                case, tree = job
                seconds, tokens[job] = ask(procs[tree], case, configs[case])
                samples[job].append(seconds)
        for proc in procs.values():
            proc.stdin.close()
            proc.wait()
    print("case,tree,output_tokens,median_s,us_per_output_token,ratio")
    medians = {job: statistics.median(s) for job, s in samples.items()}
    headline = []
    for job in jobs:
        case, tree = job
        ratio = medians[job] / medians[(case, "base")]
        us = medians[job] / tokens[job] * 1e6
        print(f"{case},{tree},{tokens[job]},{medians[job]:.4f},{us:.4f},{ratio:.3f}")
        if tree == "head":
            headline.append(f"{case} {us:.3f} us/token (target {TARGET_US[case]}, x{ratio:.2f} vs {args.baseline})")
    print("; ".join(headline))


if __name__ == "__main__":
    main()
