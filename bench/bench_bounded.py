"""Memory-bounded output mode: peak RSS, host time and ITL sketch accuracy.

Target (issue): ``output.mode=bounded`` keeps memory O(requests), not
O(tokens): a 1,000,000-request closed-loop run (1024/256 tokens) completes
with peak RSS <= 2 GB, and the ITL percentiles read from its streaming
log-bucket sketch are within 0.1% of the exact values.

Workload: closed loop, synthetic 1024/256 tokens, concurrency 256, one worker
with the default engine (vllm policy, default pool: 256 sequences, 8,192-token
budget, 26,000 blocks = 416,000 tokens, enough for 256 x 1,280 tokens, so
nothing preempts), linear timing, detokenization {workers: 2, base_ms: 2.85,
per_output_us: 61.6} (``bench_scaling.workload_config`` with the default
pool), seed 0.  Parts:

- ``headline``: ``simcore.run`` on 1,000,000 requests with
  ``output.mode=bounded``, each of ``--runs`` runs in a fresh subprocess, so
  that its peak RSS (``ru_maxrss`` of the child) is that run's alone; the
  child checks completed == requests and total_output_tokens == requests x
  256 and that nothing was preempted.  Reported: median wall seconds, µs per
  output token, peak RSS (max over runs), and the ``baseline`` RSS of a child
  that only imports simcore (interpreter + libraries) and of one after its
  warm-up run (+ numba code loaded from the cache).  The peak is reset after
  the warm-up (``/proc/self/clear_refs``), so it is the timed run's (resident
  baseline included), even if the warm-up had to recompile.
- ``scaling``: bounded vs detailed peak RSS and wall time at 25k .. 400k
  requests (one child per point, median of ``--runs``), and the slope of peak
  RSS over requests (MB per 1,000 requests) for each mode: detailed grows with
  the tokens (per-token arrays), bounded with the requests.
- ``itl_error``: at 100,000 requests, both modes in one child; the relative
  error of every ITL percentile key (median_itl_ms, p*_itl_ms, read from the
  sketch in bounded mode) and exact equality of every other summary key (the
  script stops if any differs).
- ``reference``: on a scaled-down workload (2,000 requests, concurrency 256)
  the pure-Python reference (``tests/reference``: ``sim.simulate`` +
  ``metrics.summarize``, as in ``bench_scaling.py``) and ``simcore.run`` in
  bounded mode, in one process; before timing they must agree (every request's
  first/last receipt and generated tokens against the reference's token
  receipts; the summary as tests/test_against_reference.py, the sketched ITL
  percentiles within 0.1%), then the speed-up.

The numba cache is warmed first by one small run of each mode in a
subprocess, and every child loads it with an untimed 1,000-request run before
timing, so JIT compile and cache load are excluded.  This parent process
imports neither numpy nor simcore: on Linux a child's ``ru_maxrss`` starts
from its parent's high-water mark (it is carried across fork and exec), so
the parent stays small.

Output: CSV (``case,mode,requests,output_tokens,median_s,us_per_output_token,
peak_rss_mb,detail``), then the headline on the last line.

Usage: python bench/bench_bounded.py [--runs 3] [--quick] [--requests N]
``--quick``: 200,000 requests for the headline and scaling points up to 100k.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchtime import median_seconds  # noqa: E402  (bench/ is the script directory)

OUTPUT_TOKENS = 256
CONCURRENCY = 256
WARM_REQUESTS = 1_000
TARGET_RSS_MB = 2048  # 2 GB
TARGET_ITL_REL = 1e-3  # 0.1%
HEADLINE_REQUESTS = 1_000_000
SCALING = (25_000, 50_000, 100_000, 200_000, 400_000)
SCALING_QUICK = (25_000, 50_000, 100_000)


# --------------------------------------------------------------------------- children
# Everything below runs in a subprocess (``--child JSON``) and imports simcore there.


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def reset_peak_rss() -> float:
    """The current RSS (MB); resets the peak to it (Linux ``/proc/self/clear_refs``: 5), so
    that ``ru_maxrss`` then covers what follows, not the warm-up or a JIT compile it ran
    (the numba cache goes stale when simcore's sources change)."""
    with open("/proc/self/status") as status:
        rss = next(int(line.split()[1]) for line in status if line.startswith("VmRSS:")) / 1024
    try:
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")
    except OSError:  # not Linux or not allowed: the peak includes the warm-up
        pass
    return rss


def config(num_requests: int, mode: str, concurrency: int = CONCURRENCY) -> dict:
    """The workload of this benchmark: bench_scaling's with 256 output tokens, the default pool."""
    from bench_scaling import workload_config

    mapping = workload_config(num_requests, concurrency, OUTPUT_TOKENS)
    del mapping["engine"]  # default pool (vllm): 26,000 blocks hold 256 x 1,280 tokens; nothing preempts
    mapping["output"] = {"mode": mode}
    return mapping


def child_warm() -> dict:
    """Fill the numba cache: one small run of each mode."""
    import simcore

    for mode in ("bounded", "detailed"):
        simcore.run(config(WARM_REQUESTS, mode))
    return {}


def child_import() -> dict:
    import simcore  # noqa: F401

    return {"peak_rss_mb": peak_rss_mb()}


def child_run(requests: int, mode: str, runs: int) -> dict:
    """Median seconds of ``runs`` calls of simcore.run after a warm-up, and the peak RSS."""
    import simcore

    simcore.run(config(WARM_REQUESTS, mode))  # numba cache load, excluded
    warm_rss = reset_peak_rss()
    mapping = config(requests, mode)

    def once() -> None:  # timed: simcore.run, plus the checks (well under a millisecond)
        result = simcore.run(mapping)
        s = result.summary
        preempted = int(result.requests.column("num_preemptions").to_numpy().sum())
        if s["completed"] != requests or s["total_output_tokens"] != requests * OUTPUT_TOKENS or preempted:
            raise SystemExit(
                f"{mode} run of {requests} requests: completed {s['completed']}, "
                f"total_output_tokens {s['total_output_tokens']}, preemptions {preempted}"
            )

    seconds = median_seconds(once, runs)
    return {"median_s": seconds, "peak_rss_mb": peak_rss_mb(), "warm_rss_mb": warm_rss}


def child_accuracy(requests: int) -> dict:
    """Both modes on one workload: relative error of the sketched ITL keys, equality of the rest."""
    import simcore
    from tests.test_bounded import sketched

    detailed = simcore.run(config(requests, "detailed")).summary
    bounded = simcore.run(config(requests, "bounded")).summary
    itl, differ = [], []
    for key, exact in detailed.items():
        value = bounded.get(key)
        if sketched(key) and exact is not None and value is not None:
            itl.append([key, exact, value, abs(value - exact) / abs(exact)])
        elif value != exact:
            differ.append([key, exact, value])
    return {"keys": len(detailed), "same_keys": list(bounded) == list(detailed), "itl": itl, "differ": differ,
            "tokens": detailed["total_output_tokens"]}


def child_reference(requests: int, concurrency: int, runs: int) -> dict:
    """The pure-Python reference against simcore.run (bounded): agreement, then timing."""
    import simcore
    from bench_batch import reference_inputs
    from tests.reference.metrics import summarize as reference_summarize
    from tests.reference.sim import simulate
    from tests.test_against_reference import assert_summaries_equal
    from tests.test_bounded import REL_TOL, sketched

    mapping = config(requests, "bounded", concurrency)
    ref = reference_inputs(mapping)  # the request table and send instants simcore.run builds
    m = ref["config"]["metrics"]

    def slow_sim():
        return simulate(ref["config"], *ref["args"])

    def slow_summary(slow):
        return reference_summarize(slow, ref["args"][1], ref["args"][2], m["percentiles"], m["goodput"], ref["cap_ns"])

    slow = slow_sim()
    want = slow_summary(slow)
    fast = simcore.run(mapping)
    table = fast.requests
    for column, pick in (("first_token_ms", 0), ("last_token_ms", -1)):
        got = table.column(column).to_pylist()
        expected = [toks[pick][1] / 1e6 if toks else None for toks in slow["tokens"]]
        if got != expected:
            raise SystemExit(f"reference check failed: {column} differs from the reference's token receipts")
    if table.column("generated_tokens").to_pylist() != [len(toks) for toks in slow["tokens"]]:
        raise SystemExit("reference check failed: generated_tokens differ from the reference's token receipts")
    got = {key: value for key, value in fast.summary.items() if key != "dropped_requests"}
    if got.keys() != want.keys():
        raise SystemExit(f"reference check failed: summary keys differ: {sorted(set(got) ^ set(want))}")
    checked, itl_err = len(want), 0.0
    for key in [k for k in want if sketched(k) and want[k] is not None]:
        value, exact = got.pop(key), want.pop(key)  # the sketched keys: within REL_TOL, not in the exact check
        rel = float("inf") if value is None else abs(value - exact) / abs(exact)
        if rel > REL_TOL:
            raise SystemExit(f"reference check failed: {key} {value} vs {exact} (relative error {rel:.2e})")
        itl_err = max(itl_err, rel)
    try:
        assert_summaries_equal(got, want)
    except AssertionError as error:
        raise SystemExit(f"reference check failed: summary differs from the reference: {error}")

    ref_runs = max(1, min(runs, 3))
    sim_s = median_seconds(slow_sim, ref_runs)
    sum_s = median_seconds(lambda: slow_summary(slow), ref_runs)
    run_s = median_seconds(lambda: simcore.run(mapping), runs, warm_up=True)
    return {
        "tokens": fast.summary["total_output_tokens"],
        "checked_keys": checked,
        "itl_rel": itl_err,
        "reference_sim": sim_s,
        "reference_sim+summary": sim_s + sum_s,
        "run": run_s,
    }


CHILDREN = {"warm": child_warm, "import": child_import, "run": child_run, "accuracy": child_accuracy,
            "reference": child_reference}


# --------------------------------------------------------------------------- parent


def spawn(kind: str, **kwargs) -> dict:
    """Run one child (a fresh interpreter); its result is the JSON on its last stdout line."""
    spec = json.dumps({"kind": kind, **kwargs})
    done = subprocess.run([sys.executable, __file__, "--child", spec], capture_output=True, text=True)
    if done.returncode != 0:
        sys.stderr.write(done.stderr)
        raise SystemExit(f"child {spec} failed (exit {done.returncode}): {done.stdout.strip()[-500:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def row(case, mode, requests="", tokens="", median_s=None, peak=None, detail=""):
    us = "" if median_s is None or not tokens else f"{median_s / tokens * 1e6:.4f}"
    print(
        f"{case},{mode},{requests},{tokens},{'' if median_s is None else f'{median_s:.4f}'},{us},"
        f"{'' if peak is None else f'{peak:.1f}'},{detail}",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="200,000-request headline, scaling up to 100k")
    parser.add_argument("--requests", type=int, default=None, help="headline requests (default 1,000,000; quick 200,000)")
    parser.add_argument("--accuracy-requests", type=int, default=100_000)
    parser.add_argument("--reference-requests", type=int, default=2_000)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.child:
        spec = json.loads(args.child)
        print(json.dumps(CHILDREN[spec.pop("kind")](**spec)))
        return

    start = time.perf_counter()
    spawn("warm")
    print(f"numba cache warm ({time.perf_counter() - start:.1f} s)", file=sys.stderr)
    print("case,mode,requests,output_tokens,median_s,us_per_output_token,peak_rss_mb,detail", flush=True)

    # Headline: each run in a fresh child.
    n = args.requests or (200_000 if args.quick else HEADLINE_REQUESTS)
    tokens = n * OUTPUT_TOKENS
    base = spawn("import")["peak_rss_mb"]
    row("baseline", "import_only", peak=base, detail="child that only imports simcore")
    runs = [spawn("run", requests=n, mode="bounded", runs=1) for _ in range(args.runs)]
    seconds = [r["median_s"] for r in runs]
    head_s, head_rss = statistics.median(seconds), max(r["peak_rss_mb"] for r in runs)
    warm = max(r["warm_rss_mb"] for r in runs)
    row("baseline", "warm", peak=warm, detail=f"resident after the untimed {WARM_REQUESTS}-request run (numba code loaded)")
    row("headline", "bounded", n, tokens, head_s, head_rss,
        f"runs={args.runs} (fresh child each) min_s={min(seconds):.3f} max_s={max(seconds):.3f} "
        f"rss_above_warm_mb={max(r['peak_rss_mb'] - r['warm_rss_mb'] for r in runs):.0f}")

    # Memory scaling: one child per point.
    points = SCALING_QUICK if args.quick else SCALING
    rss = {"bounded": [], "detailed": []}
    for mode in ("bounded", "detailed"):
        for requests in points:
            r = spawn("run", requests=requests, mode=mode, runs=args.runs)
            rss[mode].append(r["peak_rss_mb"])
            row("scaling", mode, requests, requests * OUTPUT_TOKENS, r["median_s"], r["peak_rss_mb"],
                f"warm_rss_mb={r['warm_rss_mb']:.0f} rss_above_warm_mb={r['peak_rss_mb'] - r['warm_rss_mb']:.0f}")
    slope = {}
    for mode in ("bounded", "detailed"):
        fit = statistics.linear_regression([p / 1000 for p in points], rss[mode])
        slope[mode] = fit.slope
        row("scaling_slope", mode, f"{points[0]}-{points[-1]}",
            detail=f"{fit.slope:.3f} MB per 1000 requests ({fit.slope * 2**20 / 1000:.0f} bytes per request; "
                   f"{fit.slope * 2**20 / 1000 / OUTPUT_TOKENS:.2f} bytes per output token) intercept {fit.intercept:.0f} MB; "
                   f"at {n} requests ~{fit.intercept + fit.slope * n / 1000:.0f} MB")

    # ITL sketch accuracy against the detailed mode.
    acc = spawn("accuracy", requests=args.accuracy_requests)
    for key, exact, value, rel in acc["itl"]:
        row("itl_error", "bounded", args.accuracy_requests, acc["tokens"],
            detail=f"{key} exact={exact:.6f} sketch={value:.6f} rel_err={rel:.2e}")
    equal = acc["keys"] - len(acc["itl"]) - len(acc["differ"])
    row("itl_error", "other_keys", args.accuracy_requests, acc["tokens"],
        detail=f"{equal} of {acc['keys'] - len(acc['itl'])} other summary keys exactly equal")
    if acc["differ"] or not acc["same_keys"]:
        raise SystemExit(f"bounded and detailed summaries differ beyond the ITL percentiles: {acc['differ']}"
                         f"{'' if acc['same_keys'] else ' (key lists differ)'}")
    itl_err = max(rel for *_, rel in acc["itl"])

    # Pure-Python reference on a scaled-down workload.
    ref = spawn("reference", requests=args.reference_requests, concurrency=CONCURRENCY, runs=args.runs)
    speedup = ref["reference_sim+summary"] / ref["run"]
    row("reference", "reference_sim", args.reference_requests, ref["tokens"], ref["reference_sim"])
    row("reference", "reference_sim+summary", args.reference_requests, ref["tokens"], ref["reference_sim+summary"])
    row("reference", "bounded", args.reference_requests, ref["tokens"], ref["run"],
        detail=f"speedup x{speedup:.0f} over simulate+summary; agrees ({ref['checked_keys']} summary keys; "
               f"ITL percentiles within {ref['itl_rel']:.1e}; first/last receipts exact)")

    rss_verdict = "met" if head_rss <= TARGET_RSS_MB else f"missed by {head_rss / TARGET_RSS_MB - 1:.0%}"
    itl_verdict = "met" if itl_err <= TARGET_ITL_REL else "missed"
    print(
        f"bounded mode: {n:,} requests x {OUTPUT_TOKENS} tokens in {head_s:.2f} s "
        f"({head_s / tokens * 1e6:.4f} us/token), peak RSS {head_rss:.0f} MB (target <= {TARGET_RSS_MB} MB: "
        f"{rss_verdict}; {base:.0f} MB is interpreter + libraries; {slope['bounded']:.2f} vs detailed "
        f"{slope['detailed']:.2f} MB per 1,000 requests); ITL percentile error <= {itl_err:.3%} "
        f"(target 0.1%: {itl_verdict}; {args.accuracy_requests:,} requests); "
        f"x{speedup:.0f} vs the pure-Python reference ({args.reference_requests:,} requests)"
    )


if __name__ == "__main__":
    main()
