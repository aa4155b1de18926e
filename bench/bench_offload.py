"""Hit rates per KV-cache tier and host cost of the CPU offload tier (issue 16, part 3).

On the full Mooncake conversation trace (``../shared/data/mooncake/conversation_trace.jsonl``,
12,031 requests sent at their timestamps), one aggregated vllm worker with
prefix caching, linear timing (every other key at its default), 128 KiB of KV
per token (``DEFAULT_KV_TOKENS``' model: 8B dense) copied at 25 GB/s each way,
over 4 workers (one worker is overloaded by the trace: its queue grows for the
whole hour):

* the hit rates per tier (``gpu_prefix_cache_hit_rate``,
  ``cpu_prefix_cache_hit_rate``) and the GB copied each way, for GPU tiers of
  ``GPU_BLOCKS`` and CPU tiers of ``CPU_BLOCKS`` blocks of 16 tokens (0: no
  tier), against the trace's offline bounds (every prefix seen before on the
  same worker, or anywhere, reused);
  CSV on stdout, the plot to ``--plot`` (default docs/img/offload_hit_rates.png);
* host µs per output token with the tier off and on (``--cost-runs`` timed
  runs after a warm-up each, medians; 1 and 4 workers, default GPU tier, a CPU
  tier of 4x it), after the table.

Usage: python bench/bench_offload.py [--cost-runs 3] [--plot PATH] [--no-cost | --cost-only]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import simcore

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT.parent / "shared" / "data" / "mooncake" / "conversation_trace.jsonl"
GPU_BLOCKS = (13_000, 26_000)  # 208k and 416k tokens per worker (the latter the vllm pool's default)
WORKERS = 4
CPU_BLOCKS = (0, 26_000, 104_000, 416_000, 1_664_000)  # up to 26.6M tokens, 3.5 TB at 128 KiB/token
BYTES_PER_TOKEN = 131072.0
BANDWIDTH_GB_S = 25.0
TRACE_BLOCK = 512


def config(gpu_blocks: int | None, cpu_blocks: int, workers: int = WORKERS) -> dict:
    pool = {"replicas": workers, "prefix_caching": True, "num_blocks": gpu_blocks}
    if cpu_blocks:
        pool["kv_offload"] = {
            "num_blocks": cpu_blocks, "bandwidth_gb_per_second": BANDWIDTH_GB_S, "bytes_per_token": BYTES_PER_TOKEN,
        }
    return {
        "seed": 0,
        "workload": {"source": "mooncake", "path": str(TRACE), "num_requests": None},
        "load": {"type": "trace"},
        "timing": {"type": "linear"},
        "engine": {"aggregated": pool},
    }


def offline_bound(workers: int = 1) -> float:
    """Prompt tokens in leading trace blocks seen in an earlier request on the
    same worker (row k on worker k mod ``workers``, SPEC §3; at most input - 1
    each), over all prompt tokens: the hit rate of an infinite cache per worker."""
    seen: list[set[int]] = [set() for _ in range(workers)]
    reused = total = 0
    for k, line in enumerate(TRACE.read_text().splitlines()):
        row = json.loads(line)
        mine = seen[k % workers]
        repeated = 0
        for h in row["hash_ids"]:
            if h not in mine:
                break
            repeated += 1
        reused += min(min(repeated, row["input_length"] // TRACE_BLOCK) * TRACE_BLOCK, row["input_length"] - 1)
        total += row["input_length"]
        mine.update(row["hash_ids"])
    return reused / total


def hit_rates() -> list[dict]:
    rows = []
    for gpu in GPU_BLOCKS:
        for cpu in CPU_BLOCKS:
            s = simcore.run(config(gpu, cpu)).summary
            rows.append({
                "gpu_blocks": gpu, "cpu_blocks": cpu,
                "hit_rate": s["prefix_cache_hit_rate"],
                "gpu_hit_rate": s["gpu_prefix_cache_hit_rate"] if cpu else s["prefix_cache_hit_rate"],
                "cpu_hit_rate": s["cpu_prefix_cache_hit_rate"] if cpu else 0.0,
                "loaded_gb": s["kv_offload_loaded_gb"] or 0.0, "stored_gb": s["kv_offload_stored_gb"] or 0.0,
                "mean_ttft_ms": s["mean_ttft_ms"], "completed": s["completed"], "incomplete": s["incomplete"],
            })
    return rows


def plot(rows: list[dict], bound: float, one_cache: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    labels, offsets = [], []
    width = 0.38
    for g, gpu in enumerate(GPU_BLOCKS):
        mine = [r for r in rows if r["gpu_blocks"] == gpu]
        x = [i + (g - 0.5) * width for i in range(len(mine))]
        ax.bar(x, [r["gpu_hit_rate"] for r in mine], width, label=f"GPU tier, {gpu * 16 // 1000}k tokens: GPU hits",
               color=("#4c72b0", "#55a868")[g])
        ax.bar(x, [r["cpu_hit_rate"] for r in mine], width, bottom=[r["gpu_hit_rate"] for r in mine],
               label="  + CPU hits", color=("#a1c4e8", "#b6e3c1")[g], hatch="//")
        offsets = range(len(mine))
        labels = ["none" if r["cpu_blocks"] == 0 else f"{r['cpu_blocks'] * 16 / 1e6:g}M" for r in mine]
    ax.axhline(bound, color="black", linestyle="--", linewidth=1, label=f"offline bound per worker {bound:.3f}")
    ax.axhline(one_cache, color="grey", linestyle=":", linewidth=1, label=f"offline bound, one cache {one_cache:.3f}")
    ax.set_xticks(list(offsets), labels)
    ax.set_xlabel("CPU tier (tokens)")
    ax.set_ylabel("prefix-cache hit rate (prompt tokens)")
    ax.set_title(f"Mooncake conversation trace, {WORKERS} vllm workers, 25 GB/s, 128 KiB/token")
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def host_cost(runs: int) -> list[dict]:
    """Host µs per output token, tier off and on, medians of ``runs`` after a warm-up."""
    out = []
    for workers in (1, 4):
        for cpu in (0, 4 * 26_000):
            cfg = config(None, cpu, workers)
            simcore.run(cfg)  # warm-up: JIT compile or cache load
            seconds, tokens = [], 0
            for _ in range(runs):
                start = time.perf_counter()
                result = simcore.run(cfg)
                seconds.append(time.perf_counter() - start)
                tokens = result.summary["total_output_tokens"]
            median = statistics.median(seconds)
            out.append({"workers": workers, "cpu_blocks": cpu, "median_s": median, "us_per_output_token": median / tokens * 1e6})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cost-runs", type=int, default=3)
    parser.add_argument("--plot", type=Path, default=ROOT / "docs" / "img" / "offload_hit_rates.png")
    parser.add_argument("--no-cost", action="store_true")
    parser.add_argument("--cost-only", action="store_true")
    args = parser.parse_args()
    if not args.cost_only:
        table(args.plot)
    if not args.no_cost:
        print("workers,cpu_blocks,median_s,us_per_output_token")
        for r in host_cost(args.cost_runs):
            print(f"{r['workers']},{r['cpu_blocks']},{r['median_s']:.3f},{r['us_per_output_token']:.3f}")


def table(plot_path: Path) -> None:
    bound, one_cache = offline_bound(WORKERS), offline_bound()
    rows = hit_rates()
    print("gpu_blocks,cpu_blocks,hit_rate,gpu_hit_rate,cpu_hit_rate,loaded_gb,stored_gb,mean_ttft_ms,completed,incomplete")
    for r in rows:
        print(f"{r['gpu_blocks']},{r['cpu_blocks']},{r['hit_rate']:.4f},{r['gpu_hit_rate']:.4f},{r['cpu_hit_rate']:.4f},"
              f"{r['loaded_gb']:.1f},{r['stored_gb']:.1f},{r['mean_ttft_ms']:.1f},{r['completed']},{r['incomplete']}",
              flush=True)
    print(f"offline_bound_per_worker,{bound:.4f}")
    print(f"offline_bound_one_cache,{one_cache:.4f}")
    plot(rows, bound, one_cache, plot_path)


if __name__ == "__main__":
    main()
