"""Host cost per output token, end to end and on the kernel path, and how it scales.

Reference workload (issue 6): closed loop, synthetic 1024/128 tokens,
concurrency 256, 20,000 requests, one worker, KV large enough for no
preemption, linear timing, detokenization {workers: 2, base_ms: 2.85,
per_output_us: 61.6}.  Two paths are timed on the same request table:

- ``run``: ``simcore.run(config)`` end to end (config validation, workload,
  engine kernel, request columns, summary and the requests table);
- ``kernel``: ``simcore.engine.api.simulate_engine`` (as ``bench_kernel.py``).

JIT compile (or numba cache load) is excluded by a warm-up call of each path;
every figure is the median of ``--runs`` runs, seed 0.  Besides the reference
workload it times concurrency 1, 1,024 and 16,384, 4 replicas x 2 attention-DP
ranks, and sweeps requests, output length, concurrency and replicas x ranks.
``max_sequences``, ``max_batched_tokens`` and ``num_blocks`` are raised where
needed so that the concurrency is real (every client request can be in the
batch at once; with vllm's 8,192-token budget a closed loop of 1024/128
requests levels off at ~900 running sequences, the prompts starving) and
nothing is preempted; the ``mean_batch``/``max_batch``
columns (sequences per rank pass, from an untimed run that logs its passes)
show it.  The ``reference`` group times the pure-Python reference
(``tests/reference``: ``sim.simulate``, plus ``metrics.summarize`` for the end
to end ratio) on a scaled-down reference workload in the same process, checks
that it agrees with the kernel to the nanosecond, and prints the speed-ups.

Output: CSV, one row per (case, path), then the headline on the last line.

Usage: python bench/bench_scaling.py [--runs 5] [--quick] [--plot [PATH]]
``--plot`` also writes a PNG of the sweeps (default docs/img/scaling.png).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import simcore  # noqa: E402
from simcore.config import load_config, merge_config  # noqa: E402
from simcore.engine import nb  # noqa: E402
from simcore.engine.api import simulate_engine  # noqa: E402
from simcore.workload.api import build_requests  # noqa: E402
from benchtime import median_seconds  # noqa: E402  (bench/ is the script directory)

DETOK = {"workers": 2, "base_ms": 2.85, "per_output_us": 61.6}
INPUT_TOKENS = 1024
BLOCK_SIZE = 16  # vllm policy default
TARGET_US = 0.03  # issue 6: per output token, end to end


def workload_config(
    num_requests: int,
    concurrency: int = 256,
    output_tokens: int = 128,
    replicas: int = 1,
    attention_dp: int = 1,
    detokenize: bool = True,
) -> dict:
    """The reference workload with the given knobs; the pool is sized so nothing queues on it.

    At the reference point (concurrency 256, 128 output tokens, one rank) this is
    exactly ``bench_kernel.py``'s configuration (num_blocks 32,768, max_sequences
    256, vllm's default 8,192-token budget).
    """
    ranks = replicas * attention_dp
    per_rank = -(-concurrency // ranks)  # requests are placed round robin
    blocks_per_seq = -(-(INPUT_TOKENS + output_tokens) // BLOCK_SIZE) + 1
    pool = {
        "replicas": replicas,
        "attention_dp": attention_dp,
        "max_sequences": max(256, per_rank),
        "num_blocks": max(32_768, 2 * per_rank * blocks_per_seq),
    }
    # In steady state a rank admits (budget - running) / input prompts per pass and
    # keeps each for ~output passes, so the running batch reaches the concurrency only
    # if budget >= concurrency x (1 + input / output); take twice that.
    budget = 2 * per_rank * (1 + -(-INPUT_TOKENS // output_tokens))
    if budget > 8192:  # vllm's default
        pool["max_batched_tokens"] = budget
    return {
        "seed": 0,
        "workload": {"num_requests": num_requests, "input_tokens": INPUT_TOKENS, "output_tokens": output_tokens},
        "load": {"type": "closed_loop", "concurrency": concurrency},
        "engine": {"aggregated": pool},
        "timing": {"type": "linear"},
        "detokenization": DETOK if detokenize else {},
    }


@dataclass
class Case:
    group: str
    name: str
    requests: int
    concurrency: int = 256
    output_len: int = 128
    replicas: int = 1
    attention_dp: int = 1
    detokenize: bool = True
    figures: dict = field(default_factory=dict)  # path -> (median_s, us_per_token)
    tokens: int = 0
    mean_batch: float = 0.0
    max_batch: int = 0

    def config(self) -> dict:
        return workload_config(
            self.requests, self.concurrency, self.output_len, self.replicas, self.attention_dp, self.detokenize
        )


def measure(case: Case, runs: int) -> None:
    config = case.config()
    cfg = load_config(config)
    requests = build_requests(cfg, None, np.random.default_rng(cfg.seed))
    # Untimed run that logs its passes: checks the sizing, gives the batch sizes.
    logged = simulate_engine(cfg, requests, None, record_passes=True)
    assert logged.num_preemptions.sum() == 0, f"{case.name}: the workload must not preempt"
    case.tokens = int(logged.generated.sum())
    assert case.tokens == case.requests * case.output_len, f"{case.name}: not every token was generated"
    batch = logged.pass_log[:, nb.PASS_NUM_DECODE] + logged.pass_log[:, nb.PASS_NUM_PREFILL]
    batch = batch[batch > 0]
    case.mean_batch, case.max_batch = float(batch.mean()), int(batch.max())
    del logged

    simulate_engine(cfg, requests, None)  # warm-up (JIT compile or cache load)
    t = median_seconds(lambda: simulate_engine(cfg, requests, None), runs)
    case.figures["kernel"] = (t, t / case.tokens * 1e6)
    result = simcore.run(config)  # warm-up of the metrics kernels
    assert result.summary["total_output_tokens"] == case.tokens
    t = median_seconds(lambda: simcore.run(config), runs)
    case.figures["run"] = (t, t / case.tokens * 1e6)


def stage_breakdown(num_requests: int, runs: int) -> list[tuple[str, float]]:
    """Where simcore.run spends its time on the reference workload (median s per stage)."""
    from simcore.metrics.api import RequestColumns, itl_stats, requests_table, summarize
    from simcore.workload.api import send_instants_ns

    config = workload_config(num_requests)
    cfg = load_config(config)
    rng = np.random.default_rng(cfg.seed)
    table = build_requests(cfg, None, rng)
    send_ns = send_instants_ns(cfg.load, table, rng)
    engine = simulate_engine(cfg, table, send_ns)
    cols = RequestColumns(engine)
    summarize(cols, table.input_tokens, cfg.metrics)
    no_detok = load_config(workload_config(num_requests, detokenize=False))
    simulate_engine(no_detok, table, None)
    stages = [
        ("config", lambda: load_config(config)),
        ("workload", lambda: build_requests(cfg, None, np.random.default_rng(cfg.seed))),
        ("engine_no_detok", lambda: simulate_engine(no_detok, table, None)),
        ("engine", lambda: simulate_engine(cfg, table, send_ns)),
        ("request_columns", lambda: RequestColumns(engine)),
        ("itl_stats", lambda: itl_stats(cols, cfg.metrics.percentiles)),
        ("summary", lambda: summarize(cols, table.input_tokens, cfg.metrics)),
        ("requests_table", lambda: requests_table(table.request_id, table.input_tokens, table.output_tokens, cols)),
    ]
    return [(name, median_seconds(fn, runs)) for name, fn in stages]


def reference_ratio(num_requests: int, concurrency: int, runs: int) -> dict:
    """Kernel and simcore.run against the pure-Python reference, same workload, same process."""
    from tests.reference.metrics import summarize as reference_summarize
    from tests.reference.sim import simulate

    config = workload_config(num_requests, concurrency)
    cfg = load_config(config)
    requests = build_requests(cfg, None, np.random.default_rng(cfg.seed))
    full = merge_config(config)
    ids, inputs, outputs = requests.request_id.to_pylist(), list(requests.input_tokens), list(requests.output_tokens)
    fast = simulate_engine(cfg, requests, None)
    simcore.run(config)

    def slow_sim():
        return simulate(full, ids, inputs, outputs, None)

    slow = slow_sim()
    recv = [t[1] for toks in slow["tokens"] for t in toks]
    assert recv == fast.token_recv_ns.tolist(), "kernel and reference disagree"
    ref_runs = max(1, min(runs, 3))
    sim_s = median_seconds(slow_sim, ref_runs)
    m = full["metrics"]
    sum_s = median_seconds(lambda: reference_summarize(slow, inputs, outputs, m["percentiles"], m["goodput"], None), ref_runs)
    kernel_s = median_seconds(lambda: simulate_engine(cfg, requests, None), runs)
    run_s = median_seconds(lambda: simcore.run(config), runs)
    tokens = int(fast.generated.sum())
    return {
        "tokens": tokens,
        "reference_sim": sim_s,
        "reference_sim+summary": sim_s + sum_s,
        "kernel": kernel_s,
        "run": run_s,
    }


def cases(quick: bool) -> list[Case]:
    ref = 20_000
    out = [
        Case("headline", "reference", ref),
        Case("headline", "reference_no_detok", ref, detokenize=False),
        Case("headline", "concurrency_1", 2_000, concurrency=1),
        Case("headline", "concurrency_1024", 40_000, concurrency=1_024),
        Case("headline", "concurrency_16384", 65_536, concurrency=16_384),
        Case("headline", "4x2_c256", ref, replicas=4, attention_dp=2),
        Case("headline", "4x2_c2048", 40_000, concurrency=2_048, replicas=4, attention_dp=2),
    ]
    req_sweep = (2_500, 5_000, 10_000, 40_000, 80_000)
    out_sweep = (16, 32, 64, 256, 512, 1024, 2048)
    conc_sweep = (4, 16, 64, 4_096)
    topo_sweep = ((2, 1), (1, 2), (4, 1), (2, 2), (8, 1), (4, 4))
    topo_total_sweep = ((2, 1), (4, 1))  # and 4x2_c256 (headline)
    if quick:
        req_sweep, out_sweep, conc_sweep, topo_sweep, topo_total_sweep = (5_000, 40_000), (32, 512), (16,), ((4, 1),), ((2, 1),)
    out += [Case("requests", f"requests_{n}", n) for n in req_sweep]
    # Output length at a constant 2.56 M output tokens.
    out += [Case("output_len", f"output_{o}", ref * 128 // o, output_len=o) for o in out_sweep]
    for c in conc_sweep:
        out.append(Case("concurrency", f"concurrency_{c}", max(2_000, min(20 * c, 40_000)), concurrency=c))
    # Replicas x ranks at 256 client requests per rank (the per-rank batch of the reference) ...
    for r, d in topo_sweep:
        out.append(Case("ranks", f"{r}x{d}_c{256 * r * d}", 40_000, 256 * r * d, replicas=r, attention_dp=d))
    # ... and at 256 in total (the per-rank batch shrinks as ranks are added).
    for r, d in topo_total_sweep:
        out.append(Case("ranks_total", f"{r}x{d}_c256", ref, replicas=r, attention_dp=d))
    return out


def write_plot(all_cases: list[Case], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter, NullLocator

    ref = next(c for c in all_cases if c.name == "reference")

    def pick(groups, key, extra=("reference",)):
        pts = {key(c): c for c in all_cases if c.group in groups or c.name in extra}
        return sorted(pts.items())

    conc_extra = ("reference", "concurrency_1", "concurrency_1024", "concurrency_16384")
    panels = [
        ("requests (concurrency 256)", [("", pick(("requests",), lambda c: c.requests))], ref.requests),
        ("output tokens per request (requests x output = 2.56 M tokens)",
         [("", pick(("output_len",), lambda c: c.output_len))], ref.output_len),
        ("concurrency (one rank; labels: mean sequences per pass)",
         [("", pick(("concurrency",), lambda c: c.concurrency, conc_extra))], ref.concurrency),
        ("ranks = replicas x attention DP (one point per rank count; all in the CSV)",
         [(", 256 per rank", pick(("ranks",), lambda c: c.replicas * c.attention_dp)),
          (", 256 in total", pick(("ranks_total",), lambda c: c.replicas * c.attention_dp,
                                  ("reference", "4x2_c256")))], 1),
    ]
    styles = {"run": ("o-", "tab:blue", "simcore.run (end to end)"), "kernel": ("s--", "tab:orange", "kernel path")}
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    for ax, (title, series, ref_x) in zip(axes.flat, panels):
        xs_all, ys_all = set(), []
        for suffix, pts in series:
            xs = [x for x, _ in pts]
            xs_all.update(xs)
            for path_name, (style, color, label) in styles.items():
                ys = [c.figures[path_name][1] for _, c in pts]
                ys_all += ys
                ax.plot(xs, ys, style if not suffix.endswith("total") else style[0] + ":", color=color,
                        label=label + suffix, alpha=1 if not suffix.endswith("total") else 0.6)
            if title.startswith("concurrency"):
                for x, c in pts:
                    ax.annotate(f"{c.mean_batch:.0f}", (x, c.figures["run"][1]), textcoords="offset points",
                                xytext=(0, 7), ha="center", fontsize=7)
            if title.startswith("ranks"):
                total = suffix.endswith("total")
                for x, c in pts:
                    ax.annotate(f"{c.replicas}x{c.attention_dp}", (x, c.figures["kernel"][1]),
                                textcoords="offset points", xytext=(0, 7 if total else -12), ha="center",
                                fontsize=7, color="grey" if total else "black")
        ax.axhline(TARGET_US, color="tab:red", lw=1, ls=":", label=f"issue 6 target ({TARGET_US} µs, end to end)")
        ax.axvline(ref_x, color="grey", lw=0.8, alpha=0.6)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.xaxis.set_major_locator(FixedLocator(sorted(xs_all)))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
        ax.tick_params(axis="x", labelsize=7, rotation=30 if len(xs_all) > 6 else 0)
        lo, hi = min(ys_all + [TARGET_US]), max(ys_all)
        ticks = [t for t in (0.01, 0.015, 0.02, 0.03, 0.05, 0.07, 0.1, 0.2, 0.3, 0.5, 1, 2) if lo / 1.3 <= t <= hi * 1.3]
        ax.set_ylim(lo / 1.25, hi * 1.6)
        ax.yaxis.set_major_locator(FixedLocator(ticks))
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.set_xlabel(title, fontsize=9)
        ax.set_ylabel("host µs per output token", fontsize=9)
        ax.grid(True, which="major", alpha=0.3)
    fig.suptitle(
        "replaysim: host time per output token (closed loop, 1024-token prompts, linear timing, detokenization on; "
        "median, JIT excluded)\ngrey line: the reference workload (20,000 requests, 1024/128, concurrency 256, one rank)",
        fontsize=9,
    )
    handles, labels = axes.flat[3].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.06, 1, 0.95))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="fewer sweep points")
    parser.add_argument("--reference-requests", type=int, default=1_000,
                        help="scaled-down reference workload for the pure-Python ratio (concurrency 256)")
    parser.add_argument("--plot", nargs="?", const=str(ROOT / "docs/img/scaling.png"), default=None)
    parser.add_argument("--no-stages", action="store_true", help="skip the simcore.run stage breakdown")
    args = parser.parse_args()

    header = ("group,case,path,requests,concurrency,replicas,attention_dp,output_len,output_tokens,"
              "mean_batch,max_batch,median_s,us_per_output_token,speedup_vs_reference")
    print(header, flush=True)
    all_cases = cases(args.quick)
    for case in all_cases:
        measure(case, args.runs)
        for path_name in ("kernel", "run"):
            median, us = case.figures[path_name]
            print(
                f"{case.group},{case.name},{path_name},{case.requests},{case.concurrency},{case.replicas},"
                f"{case.attention_dp},{case.output_len},{case.tokens},{case.mean_batch:.1f},{case.max_batch},"
                f"{median:.4f},{us:.4f},",
                flush=True,
            )

    if not args.no_stages:
        ref_tokens = 20_000 * 128
        for name, seconds in stage_breakdown(20_000, args.runs):
            print(f"stages,reference,{name},20000,256,1,1,128,{ref_tokens},,,{seconds:.4f},{seconds / ref_tokens * 1e6:.4f},",
                  flush=True)

    r = reference_ratio(args.reference_requests, 256, args.runs)
    for path_name, ref_key in (("reference_sim", None), ("reference_sim+summary", None),
                               ("kernel", "reference_sim"), ("run", "reference_sim+summary")):
        seconds = r[path_name]
        speedup = "" if ref_key is None else f"{r[ref_key] / seconds:.0f}"
        print(f"reference,scaled_reference,{path_name},{args.reference_requests},256,1,1,128,{r['tokens']},,,"
              f"{seconds:.4f},{seconds / r['tokens'] * 1e6:.4f},{speedup}", flush=True)

    if args.plot:
        write_plot(all_cases, Path(args.plot))
        print(f"plot: {args.plot}", file=sys.stderr)

    by_name = {c.name: c for c in all_cases}
    run_us = by_name["reference"].figures["run"][1]
    kernel_us = by_name["reference"].figures["kernel"][1]
    verdict = "met" if run_us <= TARGET_US else f"missed by {run_us / TARGET_US - 1:.0%}"
    print(
        f"end to end (simcore.run): {run_us:.4f} us/output token on the reference workload "
        f"(target <= {TARGET_US}: {verdict}); kernel path {kernel_us:.4f}; "
        f"x{r['reference_sim+summary'] / r['run']:.0f} end to end and x{r['reference_sim'] / r['kernel']:.0f} "
        f"kernel vs the pure-Python reference ({args.reference_requests} requests)"
    )


if __name__ == "__main__":
    main()
