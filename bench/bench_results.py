"""Result files: size, wall time and peak RSS of a large default run; JSON and CSV readers/writers.

Cases (the numba cache is warmed by one untimed run first):

- ``run_default`` / ``run_detailed``: ``python -m runners.cli`` with the
  embedded default and ``workload.num_requests=--requests`` (200,000), without
  and with ``export.detailed=true``, in a fresh subprocess each: wall time,
  peak RSS (``ru_maxrss`` of the child) and the size of every result file;
- ``json_stdlib`` / ``json_orjson``: serializing that run's detailed
  ``vllm_bench.json`` document (compact) with ``json.dumps`` and with the
  writer's orjson path, median of ``--runs``;
- ``csv_scan`` / ``csv_pyarrow``: reading a ``--rows`` (1,000,000) row request
  table CSV with the line-by-line reader and with ``read_table_file``
  (pyarrow), median of ``--runs``.

Output: CSV (``case,median_s,peak_rss_mb,files_mb,detail``), the default
run's total file size on the last line.

Usage: python bench/bench_results.py [--requests 200000] [--rows 1000000] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchtime import median_seconds  # noqa: E402  (bench/ is the script directory)


def cli_run(out: Path, requests: int, *extra: str) -> tuple[float, float, dict[str, int]]:
    """Wall seconds, peak RSS (MB) and file sizes of one ``replaysim`` run in a child process."""
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "runners.cli", f"workload.num_requests={requests}", f"output.dir={out}",
         f"hydra.run.dir={out / 'hydra'}", *extra],
        cwd=out.parent, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True,
    )
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(done.stderr)
    # The largest ru_maxrss of the children so far: runs go from the smallest peak up.
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    sizes = {p.name: p.stat().st_size for p in out.iterdir() if p.is_file()}
    return seconds, peak / 1024, sizes


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=200_000)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    import simcore
    from runners.export import vllm_bench_document
    from runners.sweep import RunnerOptions, simulate
    from runners.writer import json_text
    from simcore.workload import api as workload

    print("case,median_s,peak_rss_mb,files_mb,detail")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        cli_run(tmp / "warm", 100)
        totals = {}
        for case, extra in (("run_default", ()), ("run_detailed", ("export.detailed=true",))):
            seconds, peak, sizes = cli_run(tmp / case, args.requests, *extra)
            total = totals[case] = sum(sizes.values()) / 1e6
            files = " ".join(f"{name}={size / 1e6:.2f}MB" for name, size in sorted(sizes.items()))
            print(f"{case},{seconds:.2f},{peak:.0f},{total:.1f},{args.requests} requests: {files}")

        config = simcore.load_config({"workload": {"num_requests": args.requests}})
        options = RunnerOptions(detailed=True)
        result, tokens = simulate(config, options)
        document = vllm_bench_document(result, tokens, detailed=True)
        stdlib = median_seconds(lambda: json.dumps(document, separators=(",", ":"), allow_nan=False), args.runs)
        fast = median_seconds(lambda: json_text(document, compact=True), args.runs)
        print(f"json_stdlib,{stdlib:.3f},,,detailed vllm_bench.json of {args.requests} requests")
        print(f"json_orjson,{fast:.3f},,,speed-up {stdlib / fast:.1f}x")

        rng = np.random.default_rng(0)
        path = tmp / "requests.csv"
        inputs, outputs = rng.integers(1, 4000, args.rows), rng.integers(1, 500, args.rows)
        send = np.cumsum(rng.exponential(10.0, args.rows))
        with path.open("w") as handle:
            handle.write("request_id,input_tokens,output_tokens,send_ms\n")
            handle.writelines(f"r{i},{inputs[i]},{outputs[i]},{send[i]:.3f}\n" for i in range(args.rows))
        scan = median_seconds(lambda: workload._scan_csv(path), args.runs)
        arrow = median_seconds(lambda: workload.read_table_file(str(path)), args.runs)
        assert workload.read_table_file(str(path)).equals(workload._scan_csv(path))
        size = path.stat().st_size / 1e6
        print(f"csv_scan,{scan:.3f},,{size:.1f},{args.rows} rows, line by line")
        print(f"csv_pyarrow,{arrow:.3f},,{size:.1f},speed-up {scan / arrow:.1f}x")
    print(f"default run of {args.requests} requests writes {totals['run_default']:.1f} MB of result files")


if __name__ == "__main__":
    main()
