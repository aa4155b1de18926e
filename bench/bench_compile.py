"""Cold compile: what a first run compiles, kernel by kernel, on an empty numba cache.

Each case runs ``simcore.run`` (or ``simcore.run_batch`` for ``sweep``) in a
fresh interpreter with a fresh, empty ``NUMBA_CACHE_DIR``, and listens to
numba's ``numba:compile`` events: every compilation of a kernel for one
signature is one event; its *own* CPU time is the event's CPU time less the
compilations nested in it (a kernel's callees compile while it is typed), and
its LLVM share is the time under numba's ``numba:llvm_lock`` event.

Cases: ``default`` (the embedded default: 640 requests, closed loop, vllm,
linear timing), ``pd`` (the ``pd_1p2d`` preset), ``sglang``, ``trtllm``,
``prefix`` (vllm with prefix caching), ``sweep`` (two concurrencies through
the batch path, ``simcore.run_batch``).

Output: CSV ``case,cpu_s,wall_s,import_cpu_s,compiles,kernels,llvm_cpu_s``, then
per case its ``--top`` kernels by own CPU time (``kernel,case,own_cpu_s,llvm_cpu_s,signatures``).
CPU seconds are user + system of the whole process, so a busy machine moves them
less than wall time; compare medians of ``--runs``.

``--shared-cache`` runs the cases in the order given on one cache instead:
each row is then what that case compiles beyond the cases before it.

Usage: python bench/bench_compile.py [--cases default,pd] [--runs 1] [--top 10] [--shared-cache]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_PD = {"engine": {"mode": "disaggregated", "prefill": {"replicas": 1}, "decode": {"replicas": 2},
                  "kv_transfer": {"bandwidth_gb_per_second": 25, "bytes_per_token": 131072}}}
CASES: dict[str, object] = {
    "default": None,
    "pd": _PD,
    "sglang": {"engine": {"policy": "sglang"}},
    "trtllm": {"engine": {"policy": "trtllm"}},
    "prefix": {"engine": {"aggregated": {"prefix_caching": True}}},
    "sweep": [{"load": {"concurrency": c}} for c in (8, 64)],
}

# Runs in the child: listens to numba's compile events around one simulation.
_CHILD = r"""
import json, resource, sys, time
from collections import defaultdict
from numba.core import event

def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime

own, llvm, sigs, stack, order = defaultdict(float), defaultdict(float), defaultdict(int), [], []
run_start = 0.0

def name(dispatcher):
    f = dispatcher.py_func
    return f"{f.__module__}.{f.__qualname__}"

class Compile(event.Listener):
    def on_start(self, ev):
        stack.append([name(ev.data["dispatcher"]), cpu(), 0.0])
    def on_end(self, ev):
        kernel, start, nested = stack.pop()
        spent = cpu() - start
        own[kernel] += spent - nested
        sigs[kernel] += 1
        order.append((kernel, cpu() - run_start))
        if stack:
            stack[-1][2] += spent

class Llvm(event.Listener):
    def on_start(self, ev):
        self.start = cpu()
    def on_end(self, ev):
        llvm[stack[-1][0] if stack else "(outside a kernel)"] += cpu() - self.start

event.register("numba:compile", Compile())
event.register("numba:llvm_lock", Llvm())
wall = time.perf_counter()
import simcore
imported = run_start = cpu()
config = json.loads(sys.argv[1])
if isinstance(config, list):
    simcore.run_batch(config)
else:
    simcore.run(config)
print(json.dumps({
    "cpu_s": cpu(), "wall_s": time.perf_counter() - wall, "import_cpu_s": imported,
    "kernels": {k: [own[k], llvm[k], sigs[k]] for k in own}, "order": order,
}))
"""


def measure(config: object, tree: Path, cache: str | None = None) -> dict:
    """One run of ``config`` in a fresh interpreter importing ``tree``, with ``cache`` (None: a fresh, empty one)."""
    with tempfile.TemporaryDirectory(prefix="replaysim-cold-") as fresh:
        env = dict(os.environ, PYTHONPATH=str(tree), NUMBA_CACHE_DIR=cache or fresh, PYTHONWARNINGS="ignore")
        # cwd: ``python -c`` puts the working directory first on sys.path, ahead of PYTHONPATH
        done = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(config)], env=env, cwd=tree,
                              capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"bench_compile: the case failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated, of: " + ", ".join(CASES))
    parser.add_argument("--runs", type=int, default=1, help="cold runs per case (medians)")
    parser.add_argument("--top", type=int, default=10, help="kernels listed per case")
    parser.add_argument("--tree", type=Path, default=ROOT, help="the source tree to import")
    parser.add_argument("--shared-cache", action="store_true",
                        help="run the cases in order on one cache: what each adds to the ones before it")
    parser.add_argument("--write-timeline", type=Path, metavar="JSON",
                        help="also write each case's compile timeline (runners/compile_timeline.json, "
                             "read by runners.compile_watch); the median run by CPU time")
    args = parser.parse_args(argv)
    cases = args.cases.split(",")
    unknown = [c for c in cases if c not in CASES]
    if unknown or args.runs < 1:
        parser.error(f"unknown case {unknown[0]!r}" if unknown else "--runs must be >= 1")
    if args.shared_cache and (args.runs != 1 or args.write_timeline is not None):
        parser.error("--shared-cache takes one run per case and writes no timeline")
    rows, tops, timelines = [], [], {}
    shared = tempfile.TemporaryDirectory(prefix="replaysim-shared-") if args.shared_cache else None
    for case in cases:
        runs = []
        for _ in range(args.runs):
            started = time.perf_counter()
            runs.append(measure(CASES[case], args.tree, shared.name if shared else None))
            print(f"# {case}: {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
        median_run = sorted(runs, key=lambda r: r["cpu_s"])[len(runs) // 2]
        kernels = median_run["kernels"]
        timelines[case] = {"cpu_s": round(median_run["cpu_s"], 2),
                           "compiles": [[k, round(t, 3)] for k, t in median_run["order"]]}
        rows.append((
            case, statistics.median(r["cpu_s"] for r in runs), statistics.median(r["wall_s"] for r in runs),
            statistics.median(r["import_cpu_s"] for r in runs), sum(v[2] for v in kernels.values()), len(kernels),
            statistics.median(sum(v[1] for v in r["kernels"].values()) for r in runs),
        ))
        for kernel, (own_s, llvm_s, n) in sorted(kernels.items(), key=lambda kv: -kv[1][0])[:args.top]:
            tops.append((kernel, case, own_s, llvm_s, n))
    if shared is not None:
        shared.cleanup()
    if args.write_timeline is not None:
        document = {"source": "python bench/bench_compile.py --write-timeline (cold numba cache, CPU s since "
                              "the run started, each compilation in finishing order)",
                    "cases": timelines}
        args.write_timeline.write_text(json.dumps(document, indent=0) + "\n", encoding="utf-8")
    print("case,cpu_s,wall_s,import_cpu_s,compiles,kernels,llvm_cpu_s")
    for case, cpu_s, wall_s, import_s, compiles, kernels, llvm_s in rows:
        print(f"{case},{cpu_s:.1f},{wall_s:.1f},{import_s:.2f},{compiles},{kernels},{llvm_s:.1f}")
    print("kernel,case,own_cpu_s,llvm_cpu_s,signatures")
    for kernel, case, own_s, llvm_s, n in tops:
        print(f"{kernel},{case},{own_s:.2f},{llvm_s:.2f},{n}")


if __name__ == "__main__":
    main()
