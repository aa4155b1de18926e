"""Per-pass cost of the timing models inside the kernel, µs per pass, and the speed-up
over the slow reference way of computing the same pass times.

    python bench/bench_timing.py [--passes 200000] [--repeats 7] [--reference-passes 200000]
                                 [--aic-reference-passes 300]

Times ``simcore.timing.nb.pass_times_nb`` (a numba loop calling
``rank_time_ms_nb`` once per pass, as the engine kernel does) over random
vLLM-like batch summaries (a third decode-only, mixed and prefill-only;
``simcore.timing.aic.random_passes``, fixed seed), after a warm-up call (JIT
compile or cache load excluded); median of the repeats
(``benchtime.median_seconds``).  Models: ``linear`` (reference), ``table`` (the
RTX PRO 6000 Llama-3.1-8B profile of the shared data set) and ``aic``
(Meta-Llama-3.1-8B on h200_sxm, vLLM, default engine limits; tables from the
disk cache, built on first use; skipped without the ``replaysim[aic]`` extra),
``roofline`` (the catalogue's llama-3.1-8b on H200) and ``roofline_moe``
(gpt-oss-120b on H200: experts and two attention spans; no pure-Python
reference here, ``tests/test_roofline.py`` checks it against the formula
written out layer by layer).

In the same run, the slow reference way of computing the same pass times, on
the same random summaries, scaled down where it is slow (median of the same
repeats; ``speedup_vs_reference`` = its µs per pass / the kernel's):

- ``linear``: ``tests/reference/sim.py``'s ``ReferenceSim.rank_time_ms`` (the
  SPEC §8 formula; one dict per pass, built before timing) on the first
  ``--reference-passes``; checked equal to the kernel's times (1e-12 relative;
  the exact count is reported) first.
- ``table``: none.  No pure-Python per-pass evaluation of a profile exists
  (``tests/test_timing_models.py`` checks the kernel against hand-computed
  values and the CSV's grid points; ``simcore.timing.profile`` only builds the
  tables), so the row says so and has no ratio.
- ``aic``: direct aiconfigurator-core calls
  (``simcore.timing.aic.direct_pass_ms``, the tables' self-check reference),
  scaled down to ``--aic-reference-passes`` per repeat.  The first call (the
  database load) is untimed; the first slice is checked within the
  self-check's tolerance (``aic.MAX_REL_ERROR``, 1%) before timing; the core
  caches repeated queries, so each repeat times the next unseen slice of the
  same random sequence, and those are checked too.

Output: CSV ``model,passes,median_s,us_per_pass,reference,reference_passes,
reference_us_per_pass,speedup_vs_reference`` (reference columns empty when
there is none), then a one-line summary.  Checks go to stderr.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchtime import median_seconds  # noqa: E402  (bench/ is the script directory)
from simcore.config import ConfigError, load_config, merge_config  # noqa: E402
from simcore.timing import aic, nb  # noqa: E402
from simcore.timing.aic import AicSpec, random_passes  # noqa: E402
from simcore.timing.api import timing_arrays  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROFILE = os.path.normpath(
    os.path.join(ROOT, "..", "shared", "data", "llmservingsim-vllm-bench", "profiler", "RTXPRO6000", "meta-llama", "Llama-3.1-8B", "bf16", "tp1")
)
SUMMARY_KEYS = ("num_prefill", "prefill_tokens", "prefill_kv_tokens", "num_decode", "decode_kv_tokens")
NO_TABLE_REFERENCE = "none: no pure-Python per-pass evaluation of a profile exists (tests check hand-computed values and CSV grid points)"


def kernel_times(model: int, params: np.ndarray, table: np.ndarray, passes: np.ndarray) -> np.ndarray:
    out = np.zeros(passes.shape[0], dtype=np.float64)
    nb.pass_times_nb(model, params, table, passes, out)
    return out


def kernel_seconds(model: int, params: np.ndarray, table: np.ndarray, passes: np.ndarray, repeats: int) -> float:
    """Median seconds of ``pass_times_nb`` over ``passes`` (warm-up call untimed: JIT or cache load)."""
    out = np.zeros(passes.shape[0], dtype=np.float64)
    seconds = median_seconds(lambda: nb.pass_times_nb(model, params, table, passes, out), repeats, warm_up=True)
    if not np.isfinite(out).all() or (out < 0).any():
        raise SystemExit(f"model {model} gave a non-finite or negative pass time")
    return seconds


def linear_reference(mapping: dict, model: int, params: np.ndarray, table: np.ndarray, passes: np.ndarray):
    """A callable running ``ReferenceSim.rank_time_ms`` over ``passes``, checked against the kernel first."""
    from tests.reference.sim import ReferenceSim

    sim = ReferenceSim(merge_config(mapping), [], [], [], None)  # no requests: only the timing model is used
    # five columns: the kernel takes the longest decode context as 0 (no skew term), so does the reference
    summaries = [{**dict(zip(SUMMARY_KEYS, row)), "decode_kv_max": 0} for row in passes.tolist()]

    def fn():
        return [sim.rank_time_ms(s) for s in summaries]

    want = np.array(fn())
    got = kernel_times(model, params, table, passes)
    rel = np.abs(got - want) / np.maximum(np.abs(want), 1e-300)
    if not rel.max() <= 1e-12:
        worst = int(np.argmax(rel))
        raise SystemExit(f"check failed: linear kernel {got[worst]!r} ms != reference {want[worst]!r} ms at pass {passes[worst].tolist()}")
    exact = int((got == want).sum())
    print(f"check: linear kernel == ReferenceSim.rank_time_ms on {len(summaries)} passes ({exact} bit-exact, max rel. diff {rel.max():.1e})", file=sys.stderr)
    return fn


def aic_reference(timing, params: np.ndarray, table: np.ndarray, passes: np.ndarray, count: int, repeats: int):
    """Direct aiconfigurator-core calls; returns ``(fn, check)``.

    The first direct call loads the database (~0.2 s, untimed, like the JIT);
    ``passes[:count]`` are checked within ``aic.MAX_REL_ERROR`` before timing.
    The core caches repeated queries (~6 instead of ~9 µs per pass here), so each
    timed call of ``fn`` takes the next unseen slice of ``count`` passes;
    ``check()`` then compares every timed pass with the kernel as well.
    """
    direct = aic.direct_model(AicSpec.from_config(timing))
    slices = [passes[k * count:(k + 1) * count] for k in range(repeats + 1)]
    timed: list[tuple[np.ndarray, np.ndarray]] = []

    def direct_times(rows: np.ndarray) -> np.ndarray:
        return np.array([aic.direct_pass_ms(direct, *row) for row in rows.tolist()])

    def compare(rows: np.ndarray, want: np.ndarray) -> np.ndarray:
        got = kernel_times(nb.TIMING_AIC, params, table, np.ascontiguousarray(rows))
        err = np.abs(got - want) / np.maximum(want, 1e-12)
        if not err.max() <= aic.MAX_REL_ERROR:
            worst = int(np.argmax(err))
            raise SystemExit(
                f"check failed: aic kernel {got[worst]:.4f} ms vs direct {want[worst]:.4f} ms "
                f"({100 * err[worst]:.3f}% > {100 * aic.MAX_REL_ERROR:g}%) at pass {rows[worst].tolist()}"
            )
        return err

    aic.direct_pass_ms(direct, *passes[-1].tolist())  # loads the database
    first = (slices[0], direct_times(slices[0]))
    compare(*first)

    def fn():
        rows = slices[1 + len(timed)]
        timed.append((rows, direct_times(rows)))

    def check() -> None:
        err = np.concatenate([compare(rows, want) for rows, want in [first] + timed])
        print(
            f"check: aic kernel vs direct estimate_forward_pass_time_ms on {err.size} passes "
            f"({count} before timing, {err.size - count} timed): mean {100 * err.mean():.4f}%, "
            f"max {100 * err.max():.4f}% (limit {100 * aic.MAX_REL_ERROR:g}%)",
            file=sys.stderr,
        )

    return fn, check


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passes", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--reference-passes", type=int, default=200_000,
                        help="first passes also timed with the linear pure-Python reference")
    parser.add_argument("--aic-reference-passes", type=int, default=300,
                        help="passes per repeat timed with direct aiconfigurator-core calls (unseen ones each repeat)")
    args = parser.parse_args(argv)
    shape = AicSpec("", "", "vllm", None, 1, tokens=8192 + 256, sequences=256, context=16384)
    # random_passes is prefix-stable: the aic reference's unseen slices extend the same sequence.
    extended = random_passes(shape, max(args.passes, (args.repeats + 1) * args.aic_reference_passes), seed=0)
    passes = np.ascontiguousarray(extended[: args.passes])
    configs = {
        "linear": {"timing": {"type": "linear"}},
        "table": {"timing": {"type": "table", "profile": PROFILE, "num_layers": 32}},
        "aic": {"timing": {"type": "aic", "model": "meta-llama/Meta-Llama-3.1-8B", "gpu": "h200_sxm"}},
        "roofline": {"timing": {"type": "roofline", "model": "llama-3.1-8b", "gpu": "H200"}},
        "roofline_moe": {"timing": {"type": "roofline", "model": "gpt-oss-120b", "gpu": "H200"}},
    }
    results = {}
    print("model,passes,median_s,us_per_pass,reference,reference_passes,reference_us_per_pass,speedup_vs_reference")
    for name, cfg in configs.items():
        try:
            timing = load_config(cfg).timing
            model, params, table = timing_arrays(timing)
        except ConfigError as exc:
            print(f"# {name}: skipped ({exc})", file=sys.stderr)
            continue
        seconds = kernel_seconds(model, params, table, passes, args.repeats)
        us = seconds / args.passes * 1e6
        ref_name, ref_n, ref_us, speedup = NO_TABLE_REFERENCE, "", "", ""
        ratio = None
        if name == "linear":
            count = min(args.reference_passes, args.passes)
            ref_name = "tests/reference/sim.py ReferenceSim.rank_time_ms"
            fn = linear_reference(cfg, model, params, table, np.ascontiguousarray(passes[:count]))
            ref_seconds = median_seconds(fn, args.repeats)
        elif name == "aic":
            count = args.aic_reference_passes
            ref_name = "aiconfigurator-core estimate_forward_pass_time_ms (direct; unseen passes each repeat)"
            fn, check = aic_reference(timing, params, table, extended, count, args.repeats)
            ref_seconds = median_seconds(fn, args.repeats)
            check()
        if name in ("linear", "aic"):
            ref_us_value = ref_seconds / count * 1e6
            ratio = ref_us_value / us
            ref_n, ref_us, speedup = count, f"{ref_us_value:.4f}", f"{ratio:.1f}"
        results[name] = (us, ratio)
        print(f"{name},{args.passes},{seconds:.6f},{us:.4f},{ref_name},{ref_n},{ref_us},{speedup}", flush=True)
    versus = {"linear": "the pure-Python rank_time_ms", "table": "no pure-Python reference", "aic": "direct aiconfigurator-core calls",
              "roofline": "no pure-Python reference", "roofline_moe": "no pure-Python reference"}
    summary = ", ".join(
        f"{name} {us:.3f} us/pass ({versus[name] if ratio is None else f'x{ratio:.0f} vs {versus[name]}'})"
        for name, (us, ratio) in results.items()
    )
    print(f"per-pass timing cost in the kernel (median of {args.repeats}, JIT excluded): {summary}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
