"""Per-pass cost of the timing models inside the kernel, µs per pass.

    python bench/bench_timing.py [--passes 200000] [--repeats 7]

Times ``simcore.timing.nb.pass_times_nb`` (a numba loop calling
``rank_time_ms_nb`` once per pass, as the engine kernel does) over random
vLLM-like batch summaries (a third decode-only, mixed and prefill-only;
``simcore.timing.aic.random_passes``, fixed seed), after a warm-up call (JIT
compile or cache load excluded); median of the repeats.  Models: ``linear``
(reference), ``table`` (the RTX PRO 6000 Llama-3.1-8B profile of the shared
data set) and ``aic`` (Meta-Llama-3.1-8B on h200_sxm, vLLM, default engine
limits; tables from the disk cache, built on first use; skipped without the
``replaysim[aic]`` extra).  Output: CSV ``model,passes,median_s,us_per_pass``,
then a one-line summary.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from simcore.config import ConfigError, load_config  # noqa: E402
from simcore.timing import nb  # noqa: E402
from simcore.timing.aic import AicSpec, random_passes  # noqa: E402
from simcore.timing.api import timing_arrays  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROFILE = os.path.normpath(
    os.path.join(ROOT, "..", "shared", "data", "llmservingsim-vllm-bench", "profiler", "RTXPRO6000", "meta-llama", "Llama-3.1-8B", "bf16", "tp1")
)


def median_seconds(model: int, params: np.ndarray, table: np.ndarray, passes: np.ndarray, repeats: int) -> float:
    out = np.zeros(passes.shape[0], dtype=np.float64)
    nb.pass_times_nb(model, params, table, passes[:10], out[:10])  # compile or load the cache
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        nb.pass_times_nb(model, params, table, passes, out)
        times.append(time.perf_counter() - start)
    if not np.isfinite(out).all() or (out < 0).any():
        raise SystemExit(f"model {model} gave a non-finite or negative pass time")
    return float(np.median(times))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passes", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    shape = AicSpec("", "", "vllm", None, 1, tokens=8192 + 256, sequences=256, context=16384)
    passes = np.ascontiguousarray(random_passes(shape, args.passes, seed=0))
    configs = {
        "linear": {"timing": {"type": "linear"}},
        "table": {"timing": {"type": "table", "profile": PROFILE, "num_layers": 32}},
        "aic": {"timing": {"type": "aic", "model": "meta-llama/Meta-Llama-3.1-8B", "gpu": "h200_sxm"}},
    }
    results = {}
    print("model,passes,median_s,us_per_pass")
    for name, cfg in configs.items():
        try:
            model, params, table = timing_arrays(load_config(cfg).timing)
        except ConfigError as exc:
            print(f"# {name}: skipped ({exc})", file=sys.stderr)
            continue
        seconds = median_seconds(model, params, table, passes, args.repeats)
        results[name] = seconds / args.passes * 1e6
        print(f"{name},{args.passes},{seconds:.6f},{results[name]:.4f}")
    summary = ", ".join(f"{name} {us:.3f} us/pass" for name, us in results.items())
    print(f"per-pass timing cost in the kernel (median of {args.repeats}, JIT excluded): {summary}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
