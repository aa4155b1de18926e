"""Cold start: wall time of the ``replaysim`` command with the embedded default.

Times, in fresh subprocesses (each writes its results into a temporary
``hydra.run.dir``):

- ``warm``: ``replaysim`` as found on PATH, numba cache warm (a private
  ``NUMBA_CACHE_DIR`` filled by one untimed run first), median of ``--runs``,
  and its ratio to ``warm_baseline``: the same command importing ``git archive``
  of ``--baseline`` (default ``main``), runs interleaved with this tree's;
  bytecode is cached for both (``PYTHONDONTWRITEBYTECODE`` dropped), as in an
  installed package; ``warm_cpu`` / ``warm_baseline_cpu``: their CPU seconds
  (user + system), steadier than wall time on a shared machine;
- ``cold``: ``replaysim`` with a fresh, empty ``NUMBA_CACHE_DIR`` (every kernel
  compiles; Python bytecode caches stay warm), median of ``--cold-runs``;
- ``import_simcore`` / ``import_runners_cli``: ``import simcore`` and
  ``import runners.cli`` timed inside a fresh interpreter, median of ``--runs``;
  ``python_startup``: the bare interpreter for comparison;
- ``importtime_top`` (and ``importtime_top_baseline``, the baseline tree's): the
  top-level packages with the largest cumulative import
  time under ``import runners.cli`` (``python -X importtime``, median of ``--runs``; nested,
  so they overlap: ``simcore`` includes what it imports first, e.g. numba; a
  package's submodules imported later from outside it count too);
- ``importtime_run_top`` (and ``importtime_run_top_baseline``): the same over the whole default command
  (``python -X importtime -m runners.cli``, warm cache, one run): it adds what
  is imported only while simulating, e.g. pandas (pyarrow's pandas shim, on the
  first ``pa.array``) and scipy (numba's BLAS check, on the first cached-kernel
  load) when they are installed;
- ``reference``: the pure-Python reference (``tests/reference``) simulating and
  summarising the embedded default workload in this process (imports
  excluded), and its ratio to the warm command.

Output: CSV (``case,detail,runs,median_s,min_s,max_s,ratio``), the warm figure on the last line.

The command is ``replaysim`` as found on PATH; ``--script`` names another
(e.g. the console script beside the interpreter, without a version manager's
shim in front).  ``--keep DIR`` works in ``DIR`` and keeps the baseline tree
and the warm numba caches for the next run (see ``bench_sweep.py``).

Usage: python bench/bench_cold_start.py [--runs 5] [--cold-runs 1] [--baseline REV] [--script PATH] [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET_S = 0.6  # issue 14 (issue 6 asked 1.5): warm numba cache, imports included

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_sweep import baseline_tree, work_dir  # noqa: E402
from benchtime import command_env  # noqa: E402


def console_script() -> str:
    found = shutil.which("replaysim")
    if found is None:
        sys.exit("replaysim is not on PATH: pip install -e .")
    return found


def run_command(argv: list[str], cache_dir: str, work: str, tree: Path = ROOT, cpu: list | None = None) -> float:
    """Wall seconds of the command; its CPU seconds (user + system) appended to ``cpu`` when given."""
    # PYTHONPATH: the console script imports this checkout (or the baseline tree) even if another is
    # installed; bytecode is cached as in an installed package (else every run compiles the sources).
    env = command_env(tree, cache_dir)
    run_dir = tempfile.mkdtemp(dir=work)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(
        [*argv, f"hydra.run.dir={run_dir}"], cwd=work, env=env, capture_output=True, text=True
    )
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if cpu is not None:
        cpu.append((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime))
    if proc.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed ({proc.returncode}):\n{proc.stderr}")
    if not (Path(run_dir) / "summary.json").exists():
        sys.exit(f"{' '.join(argv)} wrote no summary.json into {run_dir}")
    return seconds


def time_in_subprocess(statement: str, cache_dir: str, tree: Path = ROOT) -> float:
    code = f"import time; t = time.perf_counter(); {statement}; print(time.perf_counter() - t)"
    env = command_env(tree, cache_dir)
    out = subprocess.run([sys.executable, "-c", code], cwd=tree, env=env, capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def wall_of_subprocess(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, cwd=ROOT, capture_output=True, check=True)
    return time.perf_counter() - start


def importtime_top(cache_dir: str, count: int, args: tuple[str, ...] = ("-c", "import runners.cli"),
                   cwd: str | Path | None = None, tree: Path = ROOT, runs: int = 1) -> list[tuple[str, float]]:
    """The top-level packages with the largest cumulative import time under ``python -X importtime <args>``
    (default: ``import runners.cli``).

    A package's time is the sum of the cumulative times of its modules imported
    from outside it (by another package or the program), so a submodule imported
    late (``scipy.linalg`` by numba's first cached-kernel load) counts too.
    ``tree``: the source tree imported; each package's median over ``runs`` runs.
    """
    env = command_env(tree, cache_dir)  # run from the tree itself: ``-c`` puts the working directory first
    runs_totals = [_importtime_totals(env, args, tree if cwd is None else cwd) for _ in range(runs)]
    names = {name for totals in runs_totals for name in totals}
    medians = {name: statistics.median(totals.get(name, 0.0) for totals in runs_totals) for name in names}
    return sorted(medians.items(), key=lambda r: -r[1])[:count]


def _importtime_totals(env: dict[str, str], args: tuple[str, ...], cwd: str | Path) -> dict[str, float]:
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", *args],
        cwd=cwd, env=env, capture_output=True, text=True, check=True,
    )
    entries = []  # (nesting level, top-level package, cumulative s), in completion order
    for line in proc.stderr.splitlines():
        # "import time: <self us> | <cumulative us> | <2 spaces per nesting level><module>"
        if not line.startswith("import time:"):
            continue
        parts = line[len("import time:"):].split("|")
        if len(parts) != 3 or not parts[1].strip().isdigit():
            continue  # the header line
        name = parts[2].rstrip()
        level = (len(name) - len(name.lstrip(" "))) // 2
        entries.append((level, name.strip().split(".")[0], int(parts[1]) / 1e6))
    totals: dict[str, float] = {}
    ancestors: list[tuple[int, str]] = []
    for level, top, seconds in reversed(entries):  # a module's line follows its imports' lines
        while ancestors and ancestors[-1][0] >= level:
            ancestors.pop()
        if not ancestors or ancestors[-1][1] != top:
            totals[top] = totals.get(top, 0.0) + seconds
        ancestors.append((level, top))
    return totals


def reference_default(cache_dir: str) -> float:
    """Pure-Python reference on the embedded default workload, simulate + summary, imports excluded."""
    sys.path.insert(0, str(ROOT))
    import numpy as np

    from simcore.config import load_config, merge_config
    from simcore.workload.api import build_requests
    from tests.reference.metrics import summarize
    from tests.reference.sim import simulate

    config = merge_config({})
    cfg = load_config({})
    requests = build_requests(cfg, None, np.random.default_rng(cfg.seed))
    ids, inputs, outputs = requests.request_id.to_pylist(), list(requests.input_tokens), list(requests.output_tokens)
    start = time.perf_counter()
    result = simulate(config, ids, inputs, outputs, None)
    m = config["metrics"]
    summarize(result, inputs, outputs, m["percentiles"], m["goodput"], None)
    return time.perf_counter() - start


def row(case: str, detail: str, values: list[float], ratio: str = "") -> None:
    print(
        f"{case},{detail},{len(values)},{statistics.median(values):.3f},{min(values):.3f},{max(values):.3f},{ratio}",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--cold-runs", type=int, default=1)
    parser.add_argument("--top", type=int, default=8, help="importtime rows to print")
    parser.add_argument("--baseline", default="main", help="commit whose warm command is timed alongside")
    parser.add_argument("--script", help="the command to time (default: replaysim on PATH)")
    parser.add_argument("--keep", type=Path, help="work directory kept between runs (baseline tree, numba caches)")
    args = parser.parse_args()
    command = [args.script or console_script()]

    with work_dir(args.keep, "replaysim-cold-start-") as work_path:
        work = str(work_path)
        warm_cache = os.path.join(work, "numba-warm")
        print("case,detail,runs,median_s,min_s,max_s,ratio", flush=True)

        cold = [run_command(command, tempfile.mkdtemp(prefix="numba-cold-", dir=work), work)
                for i in range(args.cold_runs)]
        base_tree = baseline_tree(args.baseline, work_path)
        base_cache = os.path.join(work, "numba-base")
        run_command(command, warm_cache, work)  # fills the warm cache
        run_command(command, base_cache, work, base_tree)
        warm, base, warm_cpu, base_cpu = [], [], [], []
        for _ in range(args.runs):  # interleaved, so that other load falls on both alike
            warm.append(run_command(command, warm_cache, work, cpu=warm_cpu))
            base.append(run_command(command, base_cache, work, base_tree, cpu=base_cpu))
        if cold:  # --cold-runs 0 skips the minute of compiling
            row("cold", "replaysim, empty NUMBA_CACHE_DIR (JIT compile)", cold)
        row("warm", f"{command[0]}, warm numba cache", warm,
            f"{statistics.median(base) / statistics.median(warm):.2f}")
        row("warm_baseline", f"the same, {args.baseline}", base)
        # CPU seconds (user + system): steadier than wall time on a shared machine
        row("warm_cpu", "the warm command's CPU time", warm_cpu,
            f"{statistics.median(base_cpu) / statistics.median(warm_cpu):.2f}")
        row("warm_baseline_cpu", f"the same, {args.baseline}", base_cpu)

        row("python_startup", "python -c pass (wall)", [wall_of_subprocess([sys.executable, "-c", "pass"]) for _ in range(args.runs)])
        row("import_simcore", "import simcore (in a fresh interpreter)",
            [time_in_subprocess("import simcore", warm_cache) for _ in range(args.runs)])
        cli, cli_base = [], []
        for _ in range(args.runs):
            cli.append(time_in_subprocess("import runners.cli", warm_cache))
            cli_base.append(time_in_subprocess("import runners.cli", base_cache, base_tree))
        row("import_runners_cli", "import runners.cli (in a fresh interpreter)", cli,
            f"{statistics.median(cli_base) / statistics.median(cli):.2f}")
        row("import_runners_cli_baseline", f"the same, {args.baseline}", cli_base)
        for suffix, tree, cache in (("", ROOT, warm_cache), ("_baseline", base_tree, base_cache)):
            for name, seconds in importtime_top(cache, args.top, tree=tree, runs=args.runs):
                row(f"importtime_top{suffix}", f"{name} (cumulative)", [seconds])
        for suffix, tree, cache in (("", ROOT, warm_cache), ("_baseline", base_tree, base_cache)):
            run_args = ("-m", "runners.cli", f"hydra.run.dir={tempfile.mkdtemp(dir=work)}")
            for name, seconds in importtime_top(cache, args.top, run_args, cwd=work, tree=tree, runs=args.runs):
                row(f"importtime_run_top{suffix}", f"{name} (cumulative, whole default command)", [seconds])

        ref = reference_default(warm_cache)
        warm_s = statistics.median(warm)
        row("reference", "pure-Python reference, default workload, simulate + summary (in process)", [ref],
            f"{ref / warm_s:.1f}")

    verdict = "met" if warm_s <= TARGET_S else f"missed by {warm_s - TARGET_S:.2f} s"
    cold_text = f"cold {statistics.median(cold):.1f} s" if cold else "cold not run"
    print(
        f"replaysim (embedded default), warm numba cache: {warm_s:.2f} s wall "
        f"(target <= {TARGET_S} s: {verdict}; x{statistics.median(base) / warm_s:.2f} vs {args.baseline} "
        f"{statistics.median(base):.2f} s; CPU {statistics.median(warm_cpu):.2f} s, "
        f"x{statistics.median(base_cpu) / statistics.median(warm_cpu):.2f}); {cold_text}; "
        f"the pure-Python reference alone takes x{ref / warm_s:.1f} the warm command"
    )


if __name__ == "__main__":
    main()
