"""Multi-turn sessions: host cost end to end and what prefix caching does to later turns.

Workload: 2,000 sessions of 4 turns (8,000 requests), 256 new input and 128
output tokens per turn, closed loop over 64 sessions, one vllm worker, linear
timing, detokenization {workers: 2, base_ms: 2.85, per_output_us: 61.6}.
Cases: the sessions with prefix caching off and on, and the synthetic source with
the same requests in a request table without session columns (every request
sent on any receipt, each standing alone) as the cost baseline.  Prints a CSV
(case, requests, median_s, us_per_output_token, hit_rate, mean TTFT of first
and later turns, ms), then the figures on the last line.

Usage: python bench/bench_sessions.py [--runs 5] [--sessions 2000]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import simcore  # noqa: E402
from benchtime import median_seconds  # noqa: E402  (bench/ is the script directory)

TURNS = 4
NEW_INPUT = 256
OUTPUT = 128
DETOK = {"workers": 2, "base_ms": 2.85, "per_output_us": 61.6}


def config(sessions: int, caching: bool) -> dict:
    return {
        "workload": {"source": "sessions", "sessions": {"num_sessions": sessions, "turns": TURNS,
                                                        "new_input_tokens": NEW_INPUT, "output_tokens": OUTPUT}},
        "load": {"type": "closed_loop", "concurrency": 64},
        "engine": {"aggregated": {"prefix_caching": caching, "num_blocks": 32_768}},
        "detokenization": DETOK,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--sessions", type=int, default=2000)
    args = parser.parse_args()
    sessions_table = simcore.run(config(args.sessions, False)).requests
    plain = pa.table({"input_tokens": sessions_table.column("input_tokens"),
                      "output_tokens": sessions_table.column("output_tokens")})
    plain_config = {key: value for key, value in config(args.sessions, False).items() if key != "workload"}
    cases = {
        "sessions": lambda: simcore.run(config(args.sessions, False)),
        "sessions_prefix_caching": lambda: simcore.run(config(args.sessions, True)),
        "table_without_sessions": lambda: simcore.run(plain_config, requests=plain),
    }
    n = args.sessions * TURNS
    print("case,requests,median_s,us_per_output_token,hit_rate,mean_ttft_first_turn_ms,mean_ttft_later_turns_ms")
    seconds = {}
    for case, run in cases.items():
        summary = run().summary
        seconds[case] = median_seconds(run, args.runs, warm_up=True)
        hit = summary["prefix_cache_hit_rate"]
        print(f"{case},{n},{seconds[case]:.4f},{seconds[case] / (n * OUTPUT) * 1e6:.4f},{hit:.4f},"
              f"{summary.get('mean_ttft_first_turn_ms', '')},{summary.get('mean_ttft_later_turns_ms', '')}")
    print(f"sessions: {seconds['sessions'] / seconds['table_without_sessions']:.2f}x the same requests without "
          f"sessions end to end; with prefix caching {seconds['sessions_prefix_caching'] / seconds['sessions']:.2f}x")


if __name__ == "__main__":
    main()
