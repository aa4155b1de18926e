"""Wall time of a four-parameter ``replaysim-calibrate`` fit on a 300-request measured run.

    python bench/bench_calibrate.py [--data DIR] [--max-evals 2400] [--loss bench]

The run: LLMServingSim's vLLM 0.19.0 Qwen3-32B TP2 run on the RTX PRO 6000
(``<data>/bench/RTXPRO6000/Qwen3-32B``), replayed with its profile, its
scheduler limits, its link (16 GB/s, 20 us), asynchronous scheduling and vLLM's
default CUDA-graph capture sizes, as a user would call the command.  Fitted: ``timing.prefill_scale``,
``timing.decode_scale``, ``timing.pass_overhead_us`` and
``timing.allreduce.bandwidth_gb_per_second``, with the command's default loss
unless ``--loss`` names another.  Prints the command's own output
and the wall time including start-up (numba cache loads, the first compile
if the cache is cold: run it twice for the warm figure).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "llmservingsim-vllm-bench"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(DEFAULT_DATA))
    parser.add_argument("--max-evals", type=int, default=2400)
    parser.add_argument("--loss", default=None, help="a replaysim-calibrate loss (default: its default)")
    args = parser.parse_args()
    data = os.path.normpath(args.data)
    start = time.perf_counter()
    from runners import calibrate

    with tempfile.TemporaryDirectory() as out:
        code = calibrate.main(
            [
                os.path.join(data, "bench", "RTXPRO6000", "Qwen3-32B", "vllm", "requests.jsonl"),
                "timing.type=table",
                f"timing.profile={os.path.join(data, 'profiler', 'RTXPRO6000', 'Qwen', 'Qwen3-32B', 'bf16', 'tp2')}",
                "timing.num_layers=64",
                "timing.tp=2",
                "timing.hidden_size=5120",
                "timing.allreduce.latency_us=20",
                "timing.allreduce.bandwidth_gb_per_second=16",
                "engine.aggregated.max_batched_tokens=2048",
                "engine.aggregated.max_sequences=128",
                "engine.aggregated.num_blocks=28614",
                "engine.aggregated.context_length=40960",
                "engine.aggregated.async_scheduling=true",
                "timing.cuda_graph_sizes=vllm_default",
                "--fit", "timing.prefill_scale",
                "--fit", "timing.decode_scale",
                "--fit", "timing.pass_overhead_us",
                "--fit", "timing.allreduce.bandwidth_gb_per_second",
                "--max-evals", str(args.max_evals),
                "--out", out,
            ]
            + (["--loss", args.loss] if args.loss else [])
        )
    print(f"wall time, start-up included: {time.perf_counter() - start:.1f} s")
    return code


if __name__ == "__main__":
    sys.exit(main())
