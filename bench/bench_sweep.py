"""Sweep throughput of the ``replaysim`` command, interleaved against a baseline commit.

Issue 14's sweeps: 100 points (``load.concurrency`` 1..100) of 1,000 synthetic
requests (the embedded default workload's shape, 1024/128 tokens, one vllm
worker, linear timing), default export (``vllm_bench.json`` without its
per-request arrays), each case one whole command in a fresh process
(``python -m runners.cli``, imports and Hydra start-up included):

- ``batch``: in-job batch axes, ``sweep.batch.load.concurrency=[1,...,100]``
  into an ``output.dir`` (target >= 50 points/s);
- ``multirun_basic``: ``-m load.concurrency=1,...,100`` with Hydra's basic
  launcher (target >= 10 points/s);
- ``multirun_joblib``: the same with ``hydra/launcher=local`` (joblib, one
  worker per core; no target).

This checkout and ``git archive`` of ``--baseline`` (default ``main``) run
alternately, one command of each per round, with one private, warmed
``NUMBA_CACHE_DIR`` per tree; each figure is the median of ``--runs`` rounds.

Output: CSV ``case,tree,points,median_s,points_per_s,ratio,median_cpu_s,cpu_ratio``
(ratio: the baseline's median wall time over this tree's, so > 1 is faster;
CPU: user + system seconds of the command's processes, steadier than wall
time on a shared machine), headline on the last line.  Commands run with
bytecode caching on (``PYTHONDONTWRITEBYTECODE`` dropped), as an installed
package runs.

``--keep DIR``: work in ``DIR`` instead of a temporary directory and keep it,
so that the next run reuses the baseline tree (extracted again only for
another commit) and both trees' compiled numba caches (a fresh cache costs
about two CPU-minutes of compiling per tree).

Usage: python bench/bench_sweep.py [--runs 3] [--baseline REV] [--cases batch,multirun_basic] [--keep DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_trace import export_tree  # noqa: E402
from benchtime import command_env  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
POINTS = 100
REQUESTS = 1000
TARGET_POINTS_PER_S = {"batch": 50.0, "multirun_basic": 10.0}


def case_args(case: str, out: Path, points: int = POINTS) -> list[str]:
    """The command-line arguments of ``case`` writing into ``out``."""
    values = [str(c) for c in range(1, points + 1)]
    common = [f"workload.num_requests={REQUESTS}"]
    if case == "batch":
        return [f"sweep.batch.load.concurrency=[{','.join(values)}]", *common, f"output.dir={out}"]
    launcher = ["hydra/launcher=local"] if case == "multirun_joblib" else []
    return ["-m", *launcher, f"load.concurrency={','.join(values)}", *common, f"hydra.sweep.dir={out}"]


def run(tree: Path, args: list[str], cache: Path, work: Path) -> tuple[float, float]:
    """Wall and CPU seconds (user + system, its processes) of ``python -m runners.cli <args>`` importing ``tree``.

    Exits if the command fails.
    """
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "runners.cli", *args], cwd=work, env=command_env(tree, cache),
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        sys.exit(f"{tree}: replaysim {' '.join(args[:3])} ... failed ({done.returncode}):\n{done.stderr}")
    return seconds, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


@contextlib.contextmanager
def work_dir(keep: Path | None, prefix: str):
    """``keep`` (created, left in place) or a temporary directory."""
    if keep is None:
        with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
            yield Path(tmp)
        return
    keep.mkdir(parents=True, exist_ok=True)
    yield keep.resolve()


def baseline_tree(rev: str, work: Path) -> Path:
    """``git archive`` of ``rev`` under ``work`` (``work/tree``), kept while it is of the same commit."""
    stamp = work / "tree.commit"
    if (work / "tree").is_dir() and stamp.is_file() and stamp.read_text().startswith(rev):
        return work / "tree"  # kept (also when this tree is itself an export, without git)
    sha = subprocess.run(["git", "rev-parse", rev], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    if (work / "tree").is_dir() and stamp.is_file() and stamp.read_text() == sha:
        return work / "tree"
    shutil.rmtree(work / "tree", ignore_errors=True)
    tree = export_tree(sha, work)
    stamp.write_text(sha)
    return tree


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--baseline", default="main")
    parser.add_argument("--cases", default="batch,multirun_basic")
    parser.add_argument("--keep", type=Path, help="work directory kept between runs (baseline tree, numba caches)")
    args = parser.parse_args()
    cases = args.cases.split(",")
    with work_dir(args.keep, "replaysim-bench-sweep-") as work:
        trees = {"head": ROOT, "base": baseline_tree(args.baseline, work)}
        caches = {name: work / f"numba-{name}" for name in trees}
        for name, tree in trees.items():  # compile or load every kernel the cases use, untimed
            for case in cases:
                warm = work / f"warm-{name}-{case}"
                shutil.rmtree(warm, ignore_errors=True)
                run(tree, case_args(case, warm, points=2), caches[name], work)
        walls: dict[tuple[str, str], list[float]] = {(c, t): [] for c in cases for t in trees}
        cpus: dict[tuple[str, str], list[float]] = {(c, t): [] for c in cases for t in trees}
        for round_ in range(args.runs):
            for case in cases:
                for name, tree in trees.items():
                    out = work / f"{name}-{case}-{round_}"
                    shutil.rmtree(out, ignore_errors=True)  # a kept work directory's earlier run
                    wall, cpu = run(tree, case_args(case, out), caches[name], work)
                    walls[(case, name)].append(wall)
                    cpus[(case, name)].append(cpu)
                    shutil.rmtree(out, ignore_errors=True)
    print("case,tree,points,median_s,points_per_s,ratio,median_cpu_s,cpu_ratio")
    headline = []
    for case in cases:
        base = statistics.median(walls[(case, "base")])
        base_cpu = statistics.median(cpus[(case, "base")])
        for name in trees:
            median, cpu = statistics.median(walls[(case, name)]), statistics.median(cpus[(case, name)])
            print(f"{case},{name},{POINTS},{median:.3f},{POINTS / median:.2f},{base / median:.2f},"
                  f"{cpu:.3f},{base_cpu / cpu:.2f}")
        head = statistics.median(walls[(case, "head")])
        target = TARGET_POINTS_PER_S.get(case)
        goal = f", target >= {target:g}" if target else ""
        headline.append(f"{case} {POINTS / head:.1f} points/s (x{base / head:.2f} vs {args.baseline}{goal}; "
                        f"{POINTS / statistics.median(cpus[(case, 'head')]):.1f} per CPU-second)")
    print("; ".join(headline))


if __name__ == "__main__":
    main()
