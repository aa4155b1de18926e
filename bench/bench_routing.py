"""Routing policies (docs/routing.md): their host cost, and what they do to TTFT and the prefix cache.

Three parts, all ``simcore.run`` end to end, seed 0:

- ``speed``: the reference workload (bench_scaling.py: closed loop, 1024/128
  tokens, concurrency 256, 20,000 requests, linear timing, detokenization
  ``{workers: 2, base_ms: 2.85, per_output_us: 61.6}``) over 8 workers,
  ``least_outstanding`` against ``round_robin``: host µs per output token,
  the median of ``--runs`` runs each (JIT excluded by a warm-up), runs
  interleaved; target ratio <= 1.5.
- ``mooncake``: the full Mooncake conversation trace
  (``../shared/data/mooncake/conversation_trace.jsonl``, 12,031 requests at
  their timestamps) over 4 and 8 aggregated vllm workers with prefix caching,
  linear timing, every other key at its default: p99 TTFT and the
  prefix-cache hit rate per routing policy (one run each).
- ``skewed``: a load-skewed workload, lengths with a heavy tail (log-normal
  prompts 2048 ± 4096 tokens, outputs 256 ± 1024), Poisson arrivals, 8
  workers: p99 TTFT per policy at 60 and 90 requests/s (busy, short of overload).

Output: CSV rows ``part,case,policy,metric,value``, then the headline lines.

Usage: python bench/bench_routing.py [--runs 5] [--parts speed,mooncake,skewed] [--max-requests N]
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import simcore  # noqa: E402
from bench_scaling import workload_config  # noqa: E402

TRACE = ROOT.parent / "shared" / "data" / "mooncake" / "conversation_trace.jsonl"
POLICIES = ("round_robin", "random", "least_outstanding", "least_tokens", "power_of_two", "prefix_aware")
SPEED_TARGET = 1.5
SKEWED_RATES = (60.0, 90.0)  # req/s over 8 workers: busy, short of overload


def routed(config: dict, policy: str) -> dict:
    config = copy.deepcopy(config)
    config["engine"]["router"] = {"policy": policy}
    return config


def speed(runs: int) -> list[tuple]:
    base = workload_config(20_000, replicas=8)
    configs = {policy: routed(base, policy) for policy in ("round_robin", "least_outstanding")}
    seconds = {policy: [] for policy in configs}
    tokens = {}
    for policy, config in configs.items():  # warm-up: JIT compile or cache load
        tokens[policy] = simcore.run(config).summary["total_output_tokens"]
    for _ in range(runs):
        for policy, config in configs.items():
            start = time.perf_counter()
            simcore.run(config)
            seconds[policy].append(time.perf_counter() - start)
    rows = []
    for policy in configs:
        median = sorted(seconds[policy])[len(seconds[policy]) // 2]
        rows.append(("speed", "reference_8_workers", policy, "us_per_output_token", median / tokens[policy] * 1e6))
    ratio = rows[1][4] / rows[0][4]
    rows.append(("speed", "reference_8_workers", "least_outstanding", "ratio_to_round_robin", ratio))
    return rows


def mooncake(max_requests: int | None) -> list[tuple]:
    rows = []
    for workers in (4, 8):
        base = {
            "seed": 0,
            "workload": {"source": "mooncake", "path": str(TRACE), "num_requests": None, "max_requests": max_requests},
            "load": {"type": "trace"},
            "timing": {"type": "linear"},
            "engine": {"aggregated": {"replicas": workers, "prefix_caching": True}},
            "output": {"mode": "bounded"},
        }
        for policy in POLICIES:
            start = time.perf_counter()
            summary = simcore.run(routed(base, policy)).summary
            case = f"mooncake_{workers}_workers"
            rows.append(("mooncake", case, policy, "p99_ttft_ms", summary["p99_ttft_ms"]))
            rows.append(("mooncake", case, policy, "prefix_cache_hit_rate", summary["prefix_cache_hit_rate"]))
            rows.append(("mooncake", case, policy, "run_s", time.perf_counter() - start))
            print(*rows[-3], sep=",", file=sys.stderr)
    return rows


def skewed(max_requests: int | None) -> list[tuple]:
    rows = []
    for rate in SKEWED_RATES:
        base = {
            "seed": 0,
            "workload": {
                "num_requests": max_requests or 4000, "input_dist": "lognormal", "input_tokens": 2048,
                "input_std": 4096, "output_dist": "lognormal", "output_tokens": 256, "output_std": 1024,
            },
            "load": {"type": "poisson", "request_rate": rate},
            "timing": {"type": "linear"},
            "engine": {"aggregated": {"replicas": 8}},
            "output": {"mode": "bounded"},
        }
        for policy in POLICIES[:-1]:
            summary = simcore.run(routed(base, policy)).summary
            rows.append(("skewed", f"lognormal_rate_{rate:g}", policy, "p99_ttft_ms", summary["p99_ttft_ms"]))
            rows.append(("skewed", f"lognormal_rate_{rate:g}", policy, "mean_ttft_ms", summary["mean_ttft_ms"]))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--parts", default="speed,mooncake,skewed")
    parser.add_argument("--max-requests", type=int, default=None, help="cut the trace and the skewed workload (a quick look)")
    args = parser.parse_args()
    parts = args.parts.split(",")
    rows = []
    if "speed" in parts:
        rows += speed(args.runs)
    if "mooncake" in parts:
        rows += mooncake(args.max_requests)
    if "skewed" in parts:
        rows += skewed(args.max_requests)
    print("part,case,policy,metric,value")
    for row in rows:
        print(*row[:4], f"{row[4]:.6g}", sep=",")
    values = {(case, policy, metric): value for _, case, policy, metric, value in rows}
    if "speed" in parts:
        ratio = values[("reference_8_workers", "least_outstanding", "ratio_to_round_robin")]
        print(f"speed: least_outstanding / round_robin = {ratio:.3f} per output token (target <= {SPEED_TARGET})")
    if "mooncake" in parts:
        for workers in (4, 8):
            case = f"mooncake_{workers}_workers"
            rr = values[(case, "round_robin", "prefix_cache_hit_rate")]
            pa = values[(case, "prefix_aware", "prefix_cache_hit_rate")]
            print(f"{case}: prefix-cache hit rate round_robin {rr:.4f}, prefix_aware {pa:.4f}")
    if "skewed" in parts:
        for rate in SKEWED_RATES:
            case = f"lognormal_rate_{rate:g}"
            rr = values[(case, "round_robin", "p99_ttft_ms")]
            lo = values[(case, "least_outstanding", "p99_ttft_ms")]
            print(f"{case}: p99 TTFT round_robin {rr:.1f} ms, least_outstanding {lo:.1f} ms")


if __name__ == "__main__":
    main()
