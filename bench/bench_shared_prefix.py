"""Host cost of the recurring-prompt workload (``workload.source=shared_prefix``).

Cases, the preset's prompts (10 groups x 10 prompts of 128 + 64 tokens, 64 out):

- ``build``: :func:`shared_prefix_requests` for ``--sends`` sends (default
  200,000): the cycle, lengths and ``hash_ids``;
- ``identities``: :func:`prompt_block_identities` of that table at 16-token
  engine blocks (what prefix caching builds before the kernel; 12 blocks a
  send, keyed as any ``hash_ids`` are);
- ``run_shared_prefix``: ``simcore.run`` end to end, 20,000 sends, closed loop
  at concurrency 256, one vllm worker with prefix caching, linear timing;
- ``run_synthetic``: the same lengths from the synthetic source with a 128-token
  ``workload.prefix_tokens`` (every prompt shares the system prompt, none recurs).

Output: CSV ``case,sends,median_s,us_per_send,us_per_output_token,hit_rate``,
headline on the last line.

Usage: python bench/bench_shared_prefix.py [--runs 5] [--sends 200000]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import simcore  # noqa: E402
from benchtime import median_seconds  # noqa: E402
from simcore.config import load_config  # noqa: E402
from simcore.scheduler.prefix import prompt_block_identities  # noqa: E402
from simcore.workload.shared_prefix import shared_prefix_requests  # noqa: E402

PRESET = {"num_groups": 10, "num_prompts_per_group": 10, "system_prompt_len": 128, "question_len": 64, "output_len": 64}
RUN_SENDS = 20_000
ENGINE = {"aggregated": {"prefix_caching": True}}
LOAD = {"type": "closed_loop", "concurrency": 256}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--sends", type=int, default=200_000)
    args = parser.parse_args()
    cfg = load_config({"workload": {"source": "shared_prefix", "num_requests": args.sends, "shared_prefix": PRESET}})
    sp = cfg.workload.shared_prefix

    def build():
        return shared_prefix_requests(sp, args.sends, np.random.default_rng(0))

    table = build()
    print("case,sends,median_s,us_per_send,us_per_output_token,hit_rate")
    rows = {}
    for case, fn in (("build", build), ("identities", lambda: prompt_block_identities(table, 16, sp.hash_block_tokens, 0))):
        seconds = median_seconds(fn, args.runs)
        rows[case] = seconds
        print(f"{case},{args.sends},{seconds:.4f},{seconds / args.sends * 1e6:.4f},,")
    configs = {
        "run_shared_prefix": {"workload": {"source": "shared_prefix", "num_requests": RUN_SENDS, "shared_prefix": PRESET}},
        "run_synthetic": {"workload": {"num_requests": RUN_SENDS, "input_tokens": 192, "output_tokens": 64,
                                       "prefix_tokens": 128}},
    }
    for case, config in configs.items():
        config |= {"load": LOAD, "engine": ENGINE}
        hit_rate = simcore.run(config).summary["prefix_cache_hit_rate"]
        seconds = median_seconds(lambda: simcore.run(config), args.runs, warm_up=True)
        rows[case] = seconds
        print(f"{case},{RUN_SENDS},{seconds:.4f},{seconds / RUN_SENDS * 1e6:.3f},"
              f"{seconds / (RUN_SENDS * 64) * 1e6:.4f},{hit_rate:.4f}")
    print(f"shared_prefix: {rows['build'] / args.sends * 1e6:.3f} us per send to build, "
          f"{rows['identities'] / args.sends * 1e6:.3f} us per send for block identities; end to end "
          f"{rows['run_shared_prefix'] / rows['run_synthetic']:.2f}x the synthetic shared-prefix run")


if __name__ == "__main__":
    main()
