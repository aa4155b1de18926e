"""Host cost of an MoE run with expert parallelism against the dense run of the same shape.

Shape: closed loop, synthetic 1024/128 tokens, concurrency 256, 10,000 requests,
one vllm worker of two attention-DP ranks (128 sequences, 2048 tokens per pass
each, KV large enough for no preemption), vLLM's CUDA-graph sizes, ``table``
timing from the shared data set's RTX PRO 6000 profiles:

- ``dense``: Qwen3-32B TP1 (``dense.csv``, ``attention.csv``, ``per_sequence.csv``; 64 layers);
- ``dense_lockstep``: the same with ``engine.aggregated.expert_parallel`` (the ranks'
  lock-step, dummy batches and DP padding, no MoE term);
- ``moe_ep``: Qwen3-30B-A3B-Instruct-2507 TP1 with its ``moe.csv`` (48 MoE layers,
  128 experts, top 8), ``expert_parallel`` and the all-to-all on a 16 GB/s, 20 us link.

The kernel path is ``simcore.engine.api.simulate_engine`` (JIT compile excluded by
a warm-up call), and ``simcore.run`` end to end, the cases interleaved round by round.  Prints a CSV (case, path,
requests, output_tokens, median_s, us_per_output_token, ratio_vs_dense),
then the MoE/dense ratios on the last line (target: <= 1.3).

Usage: python bench/bench_moe.py [--runs 7] [--requests 10000]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import simcore  # noqa: E402
from simcore.config import load_config  # noqa: E402
from simcore.engine.api import simulate_engine  # noqa: E402
from simcore.workload.api import build_requests  # noqa: E402
from benchtime import median_seconds  # noqa: E402  (bench/ is the script directory)

PROFILES = Path(__file__).resolve().parents[2] / "shared" / "data" / "llmservingsim-vllm-bench" / "profiler" / "RTXPRO6000"
DENSE = {"type": "table", "profile": str(PROFILES / "Qwen" / "Qwen3-32B" / "bf16" / "tp1"), "num_layers": 64,
         "cuda_graph_sizes": "vllm_default"}
MOE = {"type": "table", "profile": str(PROFILES / "Qwen" / "Qwen3-30B-A3B-Instruct-2507" / "bf16" / "tp1"),
       "num_layers": 48, "hidden_size": 2048, "cuda_graph_sizes": "vllm_default",
       "moe": {"num_experts": 128, "top_k": 8, "alltoall": {"latency_us": 20.0, "bandwidth_gb_per_second": 16.0}}}


def case_config(num_requests: int, timing: dict, expert_parallel: bool) -> dict:
    return {
        "workload": {"num_requests": num_requests, "input_tokens": 1024, "output_tokens": 128},
        "load": {"type": "closed_loop", "concurrency": 256},
        "engine": {"policy": "vllm", "aggregated": {
            "replicas": 1, "attention_dp": 2, "num_blocks": 32_768, "max_sequences": 128,
            "max_batched_tokens": 2048, "expert_parallel": expert_parallel,
        }},
        "timing": timing,
    }


def prepared(config: dict):
    """The case's two timed calls (kernel path, end to end) after a warm-up, and its output tokens."""
    cfg = load_config(config)
    requests = build_requests(cfg, None, np.random.default_rng(cfg.seed))
    run = simulate_engine(cfg, requests, None)  # warm-up: JIT compile or cache load
    assert run.num_preemptions.sum() == 0, "the workload must not preempt"
    simcore.run(config)  # warm-up of the other stages
    return (lambda: simulate_engine(cfg, requests, None)), (lambda: simcore.run(config)), int(run.generated.sum())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--requests", type=int, default=10_000)
    args = parser.parse_args(argv)
    if not PROFILES.is_dir():
        print(f"no profiles at {PROFILES}", file=sys.stderr)
        return 2
    cases = (("dense", DENSE, False), ("dense_lockstep", DENSE, True), ("moe_ep", MOE, True))
    calls = {name: prepared(case_config(args.requests, timing, ep)) for name, timing, ep in cases}
    seconds: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.runs):  # rounds: every case once per round, so a shared machine's load hits all alike
        for name, _, _ in cases:
            kernel, whole, _ = calls[name]
            for path, call in (("simulate_engine", kernel), ("simcore.run", whole)):
                seconds.setdefault((name, path), []).append(median_seconds(call, 1))
    print("case,path,requests,output_tokens,median_s,us_per_output_token,ratio_vs_dense")
    per_token: dict[tuple[str, str], float] = {}
    for name, _, _ in cases:
        tokens = calls[name][2]
        for path in ("simulate_engine", "simcore.run"):
            median = float(np.median(seconds[(name, path)]))
            us = median / tokens * 1e6
            per_token[(name, path)] = us
            ratio = us / per_token[("dense", path)]
            print(f"{name},{path},{args.requests},{tokens},{median:.4f},{us:.4f},{ratio:.3f}")
    print(
        "moe_ep / dense, host us per output token: "
        f"kernel {per_token[('moe_ep', 'simulate_engine')] / per_token[('dense', 'simulate_engine')]:.2f}x, "
        f"end to end {per_token[('moe_ep', 'simcore.run')] / per_token[('dense', 'simcore.run')]:.2f}x "
        f"(target <= 1.3x; load average {os.getloadavg()[0]:.1f})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
