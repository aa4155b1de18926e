"""Autoscaling's host cost (docs/autoscaling.md): µs per output token with and without it.

The reference workload (bench_scaling.py: closed loop, 1024/128 tokens,
concurrency 256, 20,000 requests, linear timing, the detokenizer on) over 8
workers routed ``least_outstanding``: a fixed pool (``engine.autoscale.metric:
none``) against the same pool autoscaled (``outstanding``, target 32 per
replica, from 1 replica, startup 30 s) with decisions every 15 s (the HPA's
default) and every 10 ms (about 50,000 decisions over the run: the
decision path's own cost).  The same workload on a P/D deployment (4
prefill and 4 decode replicas of the same pool, no transfer time, decode
routed ``least_outstanding``): fixed against both pools autoscaled from 1
replica each, the prefill pool on ``ttft`` (target 2 s) and the decode pool on
``itl`` (target 50 ms), decisions every 15 s, startup 30 s.  Host µs per output
token, the median of ``--runs`` runs each (JIT excluded by a warm-up), runs
interleaved, each case against its own fixed deployment; target ratio <= 1.2.

Output: CSV rows ``case,metric,value``, then the headline line.

Usage: python bench/bench_autoscale.py [--runs 5] [--requests 20000]
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

TARGET = 1.2


def configs(requests: int) -> dict[str, dict]:
    base = workload_config(requests, replicas=8)
    base["engine"]["router"] = {"policy": "least_outstanding"}
    out = {"fixed": base}
    for name, interval in (("autoscaled_15s", 15_000.0), ("autoscaled_10ms", 10.0)):
        config = copy.deepcopy(base)
        config["engine"]["autoscale"] = {"metric": "outstanding", "target": 32.0, "interval_ms": interval,
                                         "min_replicas": 1, "startup_ms": 30_000.0}
        out[name] = config
    pd = copy.deepcopy(base)
    pool = pd["engine"].pop("aggregated")
    pd["engine"].update({"mode": "disaggregated", "prefill": {**pool, "replicas": 4},
                         "decode": {**pool, "replicas": 4}, "decode_router": {"policy": "least_outstanding"}})
    out["pd_fixed"] = pd
    config = copy.deepcopy(pd)
    config["engine"]["autoscale"] = {"metric": "ttft", "target": 2000.0, "interval_ms": 15_000.0,
                                     "min_replicas": 1, "startup_ms": 30_000.0}
    config["engine"]["decode_autoscale"] = {"metric": "itl", "target": 50.0, "interval_ms": 15_000.0,
                                            "min_replicas": 1, "startup_ms": 30_000.0}
    out["pd_autoscaled_15s"] = config
    return out


def baseline(name: str) -> str:
    """The fixed deployment a case is compared with."""
    return "pd_fixed" if name.startswith("pd_") else "fixed"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--requests", type=int, default=20_000)
    args = parser.parse_args()
    cases = configs(args.requests)
    tokens, seconds, summaries = {}, {name: [] for name in cases}, {}
    for name, config in cases.items():  # warm-up: JIT compile or cache load
        summaries[name] = simcore.run(config).summary
        tokens[name] = summaries[name]["total_output_tokens"]
    for _ in range(args.runs):
        for name, config in cases.items():
            start = time.perf_counter()
            simcore.run(config)
            seconds[name].append(time.perf_counter() - start)
    us = {name: sorted(s)[len(s) // 2] / tokens[name] * 1e6 for name, s in seconds.items()}
    print("case,metric,value")
    for name in cases:
        print(f"{name},us_per_output_token,{us[name]:.4f}")
        if "scale_ups" in summaries[name]:
            print(f"{name},scale_ups,{summaries[name]['scale_ups']}")
            print(f"{name},mean_ready_replicas,{summaries[name]['mean_ready_replicas']:.3f}")
    for name in cases:
        if baseline(name) != name:
            ratio = us[name] / us[baseline(name)]
            print(f"{name},ratio_to_fixed,{ratio:.3f}")
    worst = max(us[name] / us[baseline(name)] for name in cases if baseline(name) != name)
    print(f"headline: autoscaling host cost per output token <= {worst:.3f}x the fixed pool "
          f"(target <= {TARGET}x)", file=sys.stderr)


if __name__ == "__main__":
    main()
