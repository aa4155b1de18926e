"""A compressed day of the Azure 2023 conversation trace on an autoscaled deployment and on a fixed one
sized for its peak (docs/autoscaling.md): GPU-hours, p99 TTFT and SLO attainment side by side, and a plot.

The scenario (every value below is a declared parameter of it, not a fit):

- Requests: the 19,366 rows of ``AzureLLMInferenceTrace_conv.csv`` (the
  shipped Azure LLM inference trace 2023, one hour on 2023-11-16), their
  prompt and output lengths in trace order.
- Arrivals: the trace covers one hour, so it holds no day.  Its arrival
  instants are laid over a day-shaped rate: request i, at the fraction
  ``c_i`` of the hour (its instant / the last), is sent at
  ``D x F^-1(c_i)``, where ``F`` is the cumulative of the day profile
  ``1 - a cos(2 pi tau)`` (``tau`` the fraction of the day from midnight;
  trough at midnight, peak at noon, peak/trough = ``(1 + a) / (1 - a)``,
  ``--peak-to-trough`` 4) and ``D`` the compressed day (``--day-minutes``
  15: 96x faster than a day).  The hour's own bursts and its rise and fall
  are kept, stretched and squeezed by the profile.
- Deployment: the defaults (vllm policy, linear timing of an 8B dense model
  on one H100 per replica), ``least_outstanding`` routing.
- SLO: TTFT <= ``--ttft-slo-ms`` 1000 ms (``metrics.goodput.ttft_ms``).
- Fixed: the fewest replicas (1 .. ``--max-replicas``) whose day meets the SLO
  for 99% of the requests: sized for the peak.
- Autoscaled: up to that many replicas, from 1, ``outstanding`` target
  ``--target`` 32 requests per replica, decisions every 15 s (the HPA's
  default), startup ``--startup-s`` 60 s (model load and warm-up, declared).
  Decision interval and startup are wall-clock values: not compressed with
  the day, which makes the ramps 96x steeper for the autoscaler than a real
  day's.

GPU-seconds count a replica from its start to its off (the fixed ones over
the whole run), to the run's end (its last receipt).

Output: a CSV table (deployment, replicas, GPU-hours, p99 TTFT, SLO
attainment), written to stdout, and the plot (load, replicas, p99 TTFT per
half hour of the day) to ``--out`` (PNG).

Usage: python bench/autoscale_day.py [--out docs/img/autoscale_day.png]
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from datetime import datetime
from pathlib import Path

import numpy as np
import pyarrow as pa

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import simcore  # noqa: E402

TRACE = ROOT.parent / "shared" / "data" / "azure-llm-2023" / "AzureLLMInferenceTrace_conv.csv"
WINDOWS = 48  # half hours of the day


def read_trace(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Seconds from the first arrival, prompt tokens, output tokens, in trace order."""
    seconds, inputs, outputs = [], [], []
    with open(path, newline="") as handle:
        for row in csv.DictReader(handle):
            stamp = datetime.fromisoformat(row["TIMESTAMP"][:26])  # microseconds: the 7th digit dropped
            seconds.append(stamp.timestamp())
            inputs.append(int(row["ContextTokens"]))
            outputs.append(int(row["GeneratedTokens"]))
    t = np.array(seconds)
    return t - t[0], np.array(inputs, dtype=np.int64), np.array(outputs, dtype=np.int64)


def day_instants(fraction: np.ndarray, a: float) -> np.ndarray:
    """``F^-1(fraction)``, F(tau) = tau - a sin(2 pi tau) / (2 pi), by bisection (F is increasing for a < 1)."""
    lo, hi = np.zeros_like(fraction), np.ones_like(fraction)
    for _ in range(60):
        mid = (lo + hi) / 2
        below = mid - a * np.sin(2 * math.pi * mid) / (2 * math.pi) < fraction
        lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
    return (lo + hi) / 2


def requests_table(day_minutes: float, peak_to_trough: float, path: Path) -> pa.Table:
    t, inputs, outputs = read_trace(path)
    a = (peak_to_trough - 1) / (peak_to_trough + 1)
    send_ms = day_instants(t / t[-1], a) * day_minutes * 60_000.0
    return pa.table({
        "request_id": pa.array([str(i) for i in range(t.size)]),
        "input_tokens": pa.array(inputs), "output_tokens": pa.array(outputs), "send_ms": pa.array(send_ms),
    })


def config(replicas: int, slo_ms: float, scale: dict | None = None) -> dict:
    engine = {"aggregated": {"replicas": replicas}, "router": {"policy": "least_outstanding"}}
    if scale:
        engine["autoscale"] = scale
    return {"load": {"type": "trace"}, "engine": engine, "metrics": {"goodput": {"ttft_ms": slo_ms}},
            "output": {"mode": "bounded"}}


def attainment(result) -> float:
    rows = result.requests
    ttft = rows.column("ttft_ms").to_numpy(zero_copy_only=False)
    status = np.asarray(rows.column("status").cast(pa.string()).to_pylist())
    slo = result.config.metrics.goodput.target("ttft_ms")
    return float(np.sum((status == "completed") & (np.nan_to_num(ttft, nan=np.inf) <= slo)) / len(status))


def run_end_s(result) -> float:
    """The run's end as the autoscaling summary takes it: the last receipt or rejection (at the engine arrival), s."""
    rows = result.requests
    status = np.asarray(rows.column("status").cast(pa.string()).to_pylist())
    last = rows.column("last_token_ms").to_numpy(zero_copy_only=False)
    arrival = rows.column("engine_arrival_ms").to_numpy(zero_copy_only=False)
    ends = np.concatenate([last[status == "completed"], arrival[status == "rejected"]])
    return float(np.max(ends)) / 1e3


def per_window(result, day_ms: float) -> tuple[np.ndarray, np.ndarray]:
    """Requests sent per second and p99 TTFT (ms) per window of the day, by send instant."""
    send = result.requests.column("send_ms").to_numpy(zero_copy_only=False)
    ttft = result.requests.column("ttft_ms").to_numpy(zero_copy_only=False)
    window = np.minimum((send / day_ms * WINDOWS).astype(int), WINDOWS - 1)
    rate = np.bincount(window, minlength=WINDOWS) / (day_ms / WINDOWS / 1e3)
    p99 = np.array([np.nanpercentile(ttft[window == i], 99) if np.any(window == i) else np.nan
                    for i in range(WINDOWS)])
    return rate, p99


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=TRACE)
    parser.add_argument("--day-minutes", type=float, default=15.0)
    parser.add_argument("--peak-to-trough", type=float, default=4.0)
    parser.add_argument("--ttft-slo-ms", type=float, default=1000.0)
    parser.add_argument("--target", type=float, default=32.0)
    parser.add_argument("--startup-s", type=float, default=60.0)
    parser.add_argument("--max-replicas", type=int, default=16)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img" / "autoscale_day.png")
    args = parser.parse_args()
    table = requests_table(args.day_minutes, args.peak_to_trough, args.trace)
    day_ms = args.day_minutes * 60_000.0

    fixed = None
    for replicas in range(1, args.max_replicas + 1):  # sized for the peak: the fewest meeting the SLO
        fixed = simcore.run(config(replicas, args.ttft_slo_ms), requests=table)
        print(f"sizing,{replicas},{attainment(fixed):.4f}", file=sys.stderr)
        if attainment(fixed) >= 0.99:
            break
    peak = fixed.config.engine.aggregated.replicas
    scale = {"metric": "outstanding", "target": args.target, "interval_ms": 15_000.0, "min_replicas": 1,
             "startup_ms": args.startup_s * 1e3}
    auto = simcore.run(config(peak, args.ttft_slo_ms, scale), requests=table)

    fixed_gpu_h = peak * run_end_s(fixed) / 3600
    auto_gpu_h = auto.summary["gpu_seconds"] / 3600
    print("deployment,replicas,gpu_hours,gpu_hours_per_real_day,p99_ttft_ms,slo_attainment")
    scale_to_day = 24 * 60 / args.day_minutes
    print(f"fixed,{peak},{fixed_gpu_h:.3f},{fixed_gpu_h * scale_to_day:.1f},{fixed.summary['p99_ttft_ms']:.1f},"
          f"{attainment(fixed):.4f}")
    print(f"autoscaled,1-{peak} (mean ready {auto.summary['mean_ready_replicas']:.2f}),{auto_gpu_h:.3f},"
          f"{auto_gpu_h * scale_to_day:.1f},{auto.summary['p99_ttft_ms']:.1f},{auto.summary['slo_attainment']:.4f}")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hours = (np.arange(WINDOWS) + 0.5) * 24 / WINDOWS
    rate, fixed_p99 = per_window(fixed, day_ms)
    _, auto_p99 = per_window(auto, day_ms)
    events = auto.scaling.to_pylist()
    instants = np.array([e["instant_ms"] for e in events])
    kinds = np.array([e["event"] for e in events])
    ready = np.cumsum((kinds == "ready").astype(int) - (kinds == "drain").astype(int))
    up = np.cumsum((kinds == "start").astype(int) - (kinds == "off").astype(int))
    fig, (top, middle, bottom) = plt.subplots(3, 1, figsize=(8, 8), sharex=True)
    top.plot(hours, rate, color="tab:gray")
    top.set_ylabel("requests sent / s")
    top.set_title(f"Azure 2023 conversation trace over a day compressed to {args.day_minutes:g} min")
    middle.step(instants / day_ms * 24, ready, where="post", color="tab:blue", label="autoscaled: ready")
    middle.step(instants / day_ms * 24, up, where="post", color="tab:blue", linestyle="--",
                label="autoscaled: up (GPUs paid)")
    middle.axhline(peak, color="tab:red", label=f"fixed: {peak}")
    middle.set_ylabel("replicas")
    middle.legend(loc="upper left", fontsize=8)
    bottom.plot(hours, fixed_p99, color="tab:red", label="fixed")
    bottom.plot(hours, auto_p99, color="tab:blue", label="autoscaled")
    bottom.axhline(args.ttft_slo_ms, color="black", linestyle=":", label="SLO")
    bottom.set_yscale("log")
    bottom.set_ylabel("p99 TTFT per half hour (ms)")
    bottom.set_xlabel("hour of the day (compressed)")
    bottom.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
