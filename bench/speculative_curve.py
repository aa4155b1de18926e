"""Output throughput with and without speculative decoding over concurrency (docs/speculative.md).

Closed loop of 1024/512-token requests (4 x concurrency requests, at least 32) on one vLLM worker
(256 sequences, 40,000 blocks of 16 tokens), the catalogue Llama-3.1-8B on an H100 SXM
(``timing.type=roofline``); EAGLE-3 with k = 3 at a mean acceptance length of 2.5 (``--tau``), the
proposer's cost 0.  Prints ``concurrency,plain_tok_s,speculative_tok_s,speedup`` and the first
concurrency where speculation stops paying.  A model of the trend, not a measurement.

Usage: python bench/speculative_curve.py [--tau 2.5] [--k 3] [--concurrency 1,4,16,64,128,256]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import simcore  # noqa: E402


def throughput(concurrency: int, speculative: dict | None) -> float:
    pool = {"max_sequences": 256, "num_blocks": 40_000}
    if speculative is not None:
        pool["speculative"] = speculative
    config = {
        "workload": {"num_requests": max(4 * concurrency, 32), "input_tokens": 1024, "output_tokens": 512},
        "load": {"type": "closed_loop", "concurrency": concurrency},
        "timing": {"type": "roofline", "model": "llama-3.1-8b", "gpu": "H100-SXM"},
        "engine": {"aggregated": pool},
    }
    return simcore.run(config).summary["output_throughput"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tau", type=float, default=2.5)
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--concurrency", default="1,4,16,64,128,256")
    args = parser.parse_args()
    spec = {"config": {"method": "eagle3", "num_speculative_tokens": args.k}, "mean_acceptance_length": args.tau}
    print("concurrency,plain_tok_s,speculative_tok_s,speedup")
    crossover = None
    for concurrency in (int(c) for c in args.concurrency.split(",")):
        plain, fast = throughput(concurrency, None), throughput(concurrency, spec)
        print(f"{concurrency},{plain:.1f},{fast:.1f},{fast / plain:.3f}")
        if crossover is None and fast < plain:
            crossover = concurrency
    print(f"speculation stops paying at concurrency {crossover}" if crossover else "speculation pays at every point")


if __name__ == "__main__":
    main()
