"""Host cost per output token with speculative decoding against without (docs/speculative.md).

The reference workload of ``bench_kernel.py`` (closed loop, synthetic 1024/128
tokens, concurrency 256, 20,000 requests, one worker, linear timing,
detokenization {workers: 2, base_ms: 2.85, per_output_us: 61.6}), once without
speculation and once with EAGLE-3 proposing k = 3 tokens at a mean acceptance
length of 2.5 (the geometric model), on the kernel path
(``simcore.engine.api.simulate_engine``) and end to end (``simcore.run``).
Prints a CSV (case, path, output_tokens, passes, median_s,
us_per_output_token, ratio), then the speculative / plain ratio per emitted
token on the last line (target <= 1.3).

Usage: python bench/bench_speculative.py [--runs 5] [--requests 20000] [--draws request|prompt] [--check] [--clock wall|cpu]
``--draws``: ``engine.aggregated.speculative.draws`` of the speculative case
(default: the key left out, ``request``; ``prompt``: each request its own
prompt id, the synthetic table having no ``prompt_id`` column).
``--clock cpu`` times each run by the process's CPU seconds (``time.process_time``,
steadier than wall time on a shared machine).
``--check`` first compares a scaled-down run (300 requests, concurrency 32,
speculation on) with the pure-Python reference, token by token.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import simcore  # noqa: E402
from simcore.config import load_config, merge_config  # noqa: E402
from simcore.engine.api import simulate_engine  # noqa: E402
from simcore.workload.api import build_requests  # noqa: E402
from benchtime import median_seconds  # noqa: E402  (bench/ is the script directory)

DETOK = {"workers": 2, "base_ms": 2.85, "per_output_us": 61.6}
SPEC = {"config": {"method": "eagle3", "num_speculative_tokens": 3}, "mean_acceptance_length": 2.5}


def reference_config(num_requests: int, speculative: bool, draws: str | None = None) -> dict:
    pool = {"replicas": 1, "num_blocks": 32_768, "max_sequences": 256}
    if speculative:
        pool["speculative"] = SPEC if draws is None else {**SPEC, "draws": draws}
    return {
        "workload": {"num_requests": num_requests, "input_tokens": 1024, "output_tokens": 128},
        "load": {"type": "closed_loop", "concurrency": 256},
        "engine": {"aggregated": pool},
        "timing": {"type": "linear"},
        "detokenization": DETOK,
    }


def check_against_reference() -> None:
    from tests.reference.sim import simulate

    config = reference_config(300, True)
    config["load"]["concurrency"] = 32
    cfg = load_config(config)
    requests = build_requests(cfg, None, np.random.default_rng(cfg.seed))
    fast = simulate_engine(cfg, requests, None)
    slow = simulate(merge_config(config), requests.request_id.to_pylist(), list(requests.input_tokens),
                    list(requests.output_tokens), None)
    recv = [t[1] for toks in slow["tokens"] for t in toks]
    assert recv == fast.token_recv_ns.tolist(), "kernel and reference disagree"
    assert list(fast.spec_counts[:2]) == slow["spec_counts"][:2]
    print("check: kernel == reference on 300 requests with speculation", file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--draws", choices=("request", "prompt"), default=None)
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    args = parser.parse_args()
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    if args.check:
        check_against_reference()
    print("case,path,output_tokens,passes,median_s,us_per_output_token,ratio")
    per_token = {}
    for path in ("kernel", "run"):
        for case in ("plain", "speculative"):
            config = reference_config(args.requests, case == "speculative", args.draws)
            cfg = load_config(config)
            requests = build_requests(cfg, None, np.random.default_rng(cfg.seed))
            run = simulate_engine(cfg, requests, None, record_passes=True)  # warm-up; passes counted
            assert run.num_preemptions.sum() == 0, "the reference workload must not preempt"
            tokens = int(run.generated.sum())
            passes = int(run.pass_log.shape[0])
            if path == "kernel":
                median = median_seconds(lambda: simulate_engine(cfg, requests, None), args.runs, clock=clock)
            else:
                simcore.run(config)
                median = median_seconds(lambda: simcore.run(config), args.runs, clock=clock)
            per_token[path, case] = median / tokens * 1e6
            ratio = per_token[path, case] / per_token[path, "plain"]
            print(f"{case},{path},{tokens},{passes},{median:.4f},{per_token[path, case]:.4f},{ratio:.3f}")
    print(f"speculative / plain host cost per output token: kernel {per_token['kernel', 'speculative'] / per_token['kernel', 'plain']:.3f}x, "
          f"end to end {per_token['run', 'speculative'] / per_token['run', 'plain']:.3f}x (target <= 1.3)")


if __name__ == "__main__":
    main()
