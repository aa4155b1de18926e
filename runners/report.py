"""A short, plain-text summary table of one run for the terminal."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from simcore.schema import TTFT_STAGES

WIDTH = 50
LABEL = 34
METRICS = ("ttft", "tpot", "itl", "e2el")


def _fmt(value: Any, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def _row(label: str, *values: str) -> str:
    return f"{label:<{LABEL}}" + "".join(f"{v:>12}" for v in values)


def format_summary(summary: Mapping[str, Any], out_dir: str | Path) -> str:
    """Render the headline metrics of a run as aligned text.

    Parameters
    ----------
    summary : mapping
        The run summary (``simcore.Result.summary``).  Missing keys (such as
        ``p99_*`` when 99 is not among ``metrics.percentiles``) and None values
        print as ``-``.
    out_dir : str or Path
        Where the result files were written.

    Returns
    -------
    str
        The table, without a trailing newline.
    """
    get = summary.get
    lines = [
        " replaysim result ".center(WIDTH, "="),
        *(_row(f"Requests {key}", _fmt(get(key), "d")) for key in ("completed", "rejected", "incomplete")),
        _row("Duration (s)", _fmt(get("duration_s"), ".3f")),
        _row("Request throughput (req/s)", _fmt(get("request_throughput"))),
        _row("Output throughput (tok/s)", _fmt(get("output_throughput"))),
        _row("Latency (ms)", "mean", "p99"),
    ]
    for name in METRICS:
        lines.append(_row(f"  {name.upper()}", _fmt(get(f"mean_{name}_ms")), _fmt(get(f"p99_{name}_ms"))))
    lines.append(_row("TTFT stages, mean (ms)"))
    for stage in TTFT_STAGES:
        lines.append(_row(f"  {stage.removesuffix('_ms')}", _fmt(get(f"mean_{stage}"), ".3f")))
    lines += ["=" * WIDTH, f"Output directory: {out_dir}"]
    return "\n".join(line.rstrip() for line in lines)
