"""Queue orders: vLLM priority scheduling against FCFS, per-class p99 TTFT and host cost.

Deployment: one vllm worker, linear timing (base 6 ms, 60 us per prefill token,
100 us per decode sequence, 2 ns per KV token), 1,500 blocks of 16 tokens (24k
tokens of KV: admission waits for blocks, so a queue forms, and decodes preempt;
with a larger cache the token budget admits every waiting request at once at
this load and no order changes anything).  Workload: prompts uniform in [256,
2048], outputs uniform in [64, 512] tokens, two priority classes (0 high, 1
low) drawn 1 : 4 (``workload.priority_classes``, a stream of its own, so the
FCFS run has the same lengths and sends).  Load: Poisson at ``--load`` (0.8)
times the deployment's saturation throughput, measured first as the request
throughput of a closed loop of 512 clients over the same requests.

Prints a CSV (case, requests, output_tokens, median_s, us_per_output_token,
p99 TTFT of the high and low class, ms, preemptions), then the ratio of host
cost per output token (priority / fcfs; medians of ``--runs`` timed
``simcore.run`` calls each, interleaved round by round, after an untimed run of
each, so JIT compilation is excluded) and the p99 TTFT changes.

``--case lpm``: SGLang ``--schedule-policy lpm`` against ``fcfs`` on a shared-prefix
workload, the Mooncake conversation trace (``../shared/data/mooncake/conversation_trace.jsonl``,
its first ``--requests`` rows, sent at their timestamps sped up ``--speedup`` times),
one sglang worker with prefix caching on (``--block-size``, default 16 tokens per
page; SGLang's own default is 1), linear timing (the priority case's), every other
key at its default.  Prints the CSV (case, requests, output_tokens, median_s,
us_per_output_token, prefix_cache_hit_rate, mean and p99 TTFT, ms), then the cost
ratio (lpm / fcfs, target <= 1.2) and the hit-rate and TTFT changes.

``--case dfs-weight``: SGLang ``--schedule-policy dfs-weight`` against ``fcfs``, the lpm
case's deployment and workload and output.

``--clock cpu`` times each run by the process's CPU seconds (``time.process_time``)
instead of wall seconds.

Usage: python bench/bench_queue_orders.py [--runs 5] [--requests 4000] [--load 0.8]
       python bench/bench_queue_orders.py --case lpm|dfs-weight [--runs 5] [--requests 2000] [--speedup 1]
                                          [--block-size 16] [--clock wall|cpu]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import simcore  # noqa: E402
from simcore.workload.api import priority_draws  # noqa: E402
from benchtime import median_seconds  # noqa: E402  (bench/ is the script directory)

SEED = 1
TRACE = Path(__file__).resolve().parents[2] / "shared" / "data" / "mooncake" / "conversation_trace.jsonl"
BLOCKS = 1500  # 24k tokens of KV: admission waits for blocks, and decodes preempt
CLASSES = [0, 1]
WEIGHTS = [1, 4]
TIMING = {"type": "linear", "base_ms": 6.0, "per_prefill_token_us": 60.0, "per_decode_seq_us": 100.0,
          "per_kv_token_ns": 2.0}


def config(requests: int, load: dict, order: str) -> dict:
    workload = {"num_requests": requests, "input_dist": "uniform", "input_tokens": 2048, "range_ratio": 0.125,
                "output_dist": "uniform", "output_tokens": 512}
    if order == "priority":
        workload = {**workload, "priority_classes": CLASSES, "priority_weights": WEIGHTS}
    return {
        "seed": SEED,
        "workload": workload,
        "load": load,
        "engine": {"aggregated": {"num_blocks": BLOCKS, "block_size": 16, "queue_order": order}},
        "timing": TIMING,
    }


def class_p99_ttft(result, classes: np.ndarray) -> list[float]:
    table = result.requests
    ttft = np.asarray(table.column("ttft_ms").to_numpy(zero_copy_only=False), dtype=np.float64)
    done = np.asarray(table.column("status").to_pylist()) == "completed"
    return [float(np.percentile(ttft[done & (classes == c)], 99)) for c in CLASSES]


def timed(configs: dict, runs: int, clock=time.perf_counter) -> tuple[dict, dict]:
    """Each configuration's result (an untimed run, also the warm-up: JIT, caches) and the
    seconds (wall, or ``clock``'s) of ``runs`` more, interleaved round by round (the machine is shared)."""
    results = {name: simcore.run(cfg) for name, cfg in configs.items()}
    seconds = {name: [] for name in configs}
    for _ in range(runs):
        for name, cfg in configs.items():
            seconds[name].append(median_seconds(lambda cfg=cfg: simcore.run(cfg), 1, clock=clock))
    return results, seconds


def lpm_config(requests: int, speedup: float, block_size: int, order: str) -> dict:
    return {
        "seed": SEED,
        "workload": {"source": "mooncake", "path": str(TRACE), "num_requests": None, "max_requests": requests},
        "load": {"type": "trace", "speedup": speedup},
        "engine": {"policy": "sglang", "aggregated": {"prefix_caching": True, "block_size": block_size,
                                                      "queue_order": order}},
        "timing": TIMING,
    }


def lpm_main(args) -> None:
    """The cache-aware orders' case (``--case lpm`` or ``dfs-weight``) against fcfs."""
    case = args.case
    orders = ("fcfs", case)
    configs = {order: lpm_config(args.requests, args.speedup, args.block_size, order) for order in orders}
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    results, seconds = timed(configs, args.runs, clock)
    print(f"# {args.clock} seconds, medians of {args.runs} interleaved runs")
    print("case,requests,output_tokens,median_s,us_per_output_token,prefix_cache_hit_rate,mean_ttft_ms,p99_ttft_ms")
    cost, summary = {}, {}
    for order in orders:
        result = results[order]
        tokens = int(np.asarray(result.requests.column("generated_tokens")).sum())
        median = statistics.median(seconds[order])
        cost[order] = median / tokens * 1e6
        summary[order] = result.summary
        print(f"{order},{args.requests},{tokens},{median:.4f},{cost[order]:.4f},"
              f"{summary[order]['prefix_cache_hit_rate']:.4f},{summary[order]['mean_ttft_ms']:.2f},"
              f"{summary[order]['p99_ttft_ms']:.2f}")
    print(f"{case}: host cost per output token {cost[case] / cost['fcfs']:.3f}x fcfs; prefix hit rate "
          f"{summary['fcfs']['prefix_cache_hit_rate']:.4f} -> {summary[case]['prefix_cache_hit_rate']:.4f}; mean TTFT "
          f"{summary['fcfs']['mean_ttft_ms']:.1f} -> {summary[case]['mean_ttft_ms']:.1f} ms; p99 TTFT "
          f"{summary['fcfs']['p99_ttft_ms']:.1f} -> {summary[case]['p99_ttft_ms']:.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=("priority", "lpm", "dfs-weight"), default="priority")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--requests", type=int, default=None, help="default: 4000 (priority), 2000 (lpm)")
    parser.add_argument("--load", type=float, default=0.8)
    parser.add_argument("--speedup", type=float, default=1.0, help="lpm: load.speedup of the trace")
    parser.add_argument("--block-size", type=int, default=16, help="lpm: tokens per page")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="lpm, dfs-weight: time runs by wall or process CPU seconds")
    args = parser.parse_args()
    if args.case in ("lpm", "dfs-weight"):
        args.requests = args.requests or 2000
        lpm_main(args)
        return
    args.requests = args.requests or 4000
    saturated = simcore.run(config(args.requests, {"type": "closed_loop", "concurrency": 512}, "fcfs"))
    capacity = saturated.summary["request_throughput"]
    load = {"type": "poisson", "request_rate": args.load * capacity}
    classes = priority_draws(tuple(CLASSES), tuple(WEIGHTS), args.requests, SEED)
    print(f"# saturation {capacity:.3f} req/s; offered {load['request_rate']:.3f} req/s ({args.load:g} load); "
          f"high class {int((classes == 0).sum())} of {args.requests} requests")
    print("case,requests,output_tokens,median_s,us_per_output_token,p99_ttft_high_ms,p99_ttft_low_ms,preemptions")
    orders = ("fcfs", "priority")
    configs = {order: config(args.requests, load, order) for order in orders}
    results, seconds = timed(configs, args.runs)
    cost, p99 = {}, {}
    for order in orders:
        result = results[order]
        tokens = int(np.asarray(result.requests.column("generated_tokens")).sum())
        median = statistics.median(seconds[order])
        cost[order] = median / tokens * 1e6
        p99[order] = class_p99_ttft(result, classes)
        preemptions = int(np.asarray(result.requests.column("num_preemptions")).sum())
        print(f"{order},{args.requests},{tokens},{median:.4f},{cost[order]:.4f},{p99[order][0]:.2f},"
              f"{p99[order][1]:.2f},{preemptions}")
    print(f"priority: host cost per output token {cost['priority'] / cost['fcfs']:.3f}x fcfs; p99 TTFT high class "
          f"{p99['fcfs'][0]:.1f} -> {p99['priority'][0]:.1f} ms, low class {p99['fcfs'][1]:.1f} -> "
          f"{p99['priority'][1]:.1f} ms")


if __name__ == "__main__":
    main()
