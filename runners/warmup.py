"""``replaysim-warmup``: fill numba's cache once, before runs that should not compile.

A first run compiles the kernels its configuration uses (``docs/performance.md``,
"Cold compile").  This command runs a tiny configuration of each chosen case
(16 requests; kernels compile by argument types, not sizes, so what a tiny
run compiles is what the full-size run of that shape needs): ``default`` first,
in this process, because every other case reuses its kernels; then the others
in ``--jobs`` worker processes, which load ``default``'s kernels from the cache
and compile only what their own shape adds.  Point ``NUMBA_CACHE_DIR`` at a
directory that the later runs see (on a cluster, a shared file system: see
``docs/performance.md`` for the CPU-target caveat).

Exit codes: 0 done; 2 bad arguments (one line).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

_TINY: dict[str, Any] = {"workload": {"num_requests": 16, "input_tokens": 64, "output_tokens": 4}}
_DETOK = {"detokenization": {"workers": 2, "base_ms": 2.85, "per_output_us": 61.6}}
_PD = {"engine": {"mode": "disaggregated", "prefill": {"replicas": 1}, "decode": {"replicas": 2},
                  "kv_transfer": {"bandwidth_gb_per_second": 25, "bytes_per_token": 131072}}}

#: Case -> the configurations it runs (over :data:`_TINY`); a list runs as one ``run_batch``.
CASES: dict[str, list[dict[str, Any]]] = {
    "default": [{}],
    "detokenization": [_DETOK],
    "bounded": [{"output": {"mode": "bounded"}, **_DETOK}],
    "open_loop": [{"load": {"type": "poisson", "request_rate": 20}, **_DETOK}],
    "pd": [_PD],
    "sglang": [{"engine": {"policy": "sglang"}}],
    "trtllm": [{"engine": {"policy": "trtllm"}}],
    "prefix": [{"engine": {"aggregated": {"prefix_caching": True}}}],
    "replicas": [{"engine": {"aggregated": {"replicas": 2, "attention_dp": 2}}}],
    "batch": [{"load": {"concurrency": 2}}, {"load": {"concurrency": 4}}],
}


def _merged(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        out[key] = _merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def warm(case: str) -> tuple[str, float]:
    """Run ``case``'s tiny configurations; returns ``(case, wall seconds)``.

    Parameters
    ----------
    case : str
        A key of :data:`CASES`.

    Returns
    -------
    tuple of (str, float)
    """
    import simcore

    started = time.perf_counter()
    configs = [_merged(_TINY, extra) for extra in CASES[case]]
    if len(configs) > 1:
        simcore.run_batch(configs)
    else:
        simcore.run(configs[0])
    return case, time.perf_counter() - started


class _ArgumentsError(Exception):
    """argparse's message (its own error() prints the usage too: two lines)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        raise _ArgumentsError(message)


def main(argv: list[str] | None = None) -> int:
    """The ``replaysim-warmup`` command.

    Parameters
    ----------
    argv : list of str, optional
        The arguments (default ``sys.argv[1:]``).

    Returns
    -------
    int
        The exit code.
    """
    parser = _Parser(
        prog="replaysim-warmup",
        description="Compile replaysim's kernels into numba's cache (NUMBA_CACHE_DIR) before the runs that use them.",
    )
    parser.add_argument("--cases", default=",".join(CASES),
                        help="comma-separated, of: " + ", ".join(CASES) + " (default: all; default always runs first)")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1),
                        help="worker processes for the cases after default (default: min(2, CPUs))")
    try:
        args = parser.parse_args(argv)
    except _ArgumentsError as exc:  # one line, as every command's bad input
        print(f"replaysim-warmup: error: {exc}", file=sys.stderr)
        return 2
    except SystemExit as exc:  # --help
        return int(exc.code or 0)
    cases = [c for c in args.cases.split(",") if c]
    unknown = [c for c in cases if c not in CASES]
    if unknown or not cases:
        print(f"replaysim-warmup: error: --cases: unknown case {unknown[0]!r}" if unknown
              else "replaysim-warmup: error: --cases: no case given", file=sys.stderr)
        return 2
    if not 1 <= args.jobs <= 64:
        print(f"replaysim-warmup: error: --jobs must be in [1, 64], got {args.jobs}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    rest = [c for c in cases if c != "default"]
    print(f"replaysim-warmup: default, then {len(rest)} more case(s) on {args.jobs} process(es)", flush=True)
    done = [warm("default")]
    print(f"replaysim-warmup: default in {done[0][1]:.1f} s", flush=True)
    if rest:
        # spawn: a fresh interpreter per worker, not a fork of one that holds LLVM's state
        with ProcessPoolExecutor(min(args.jobs, len(rest)), multiprocessing.get_context("spawn")) as pool:
            for case, seconds in pool.map(warm, rest):
                print(f"replaysim-warmup: {case} in {seconds:.1f} s", flush=True)
    print(f"replaysim-warmup: done in {time.perf_counter() - started:.1f} s", flush=True)
    return 0


def entry() -> None:
    """Console-script entry point."""
    sys.exit(main())
