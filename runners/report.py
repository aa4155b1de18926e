"""A short, plain-text summary table of one run for the terminal."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from simcore.metrics.registry import DISTRIBUTIONS, PER_TURN, TURN_GROUPS, per_turn, percentile_names, summary_key
from simcore.schema import TTFT_STAGES

LABEL = 28
CELL = 10


def _fmt(value: Any, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def _row(label: str, *values: str) -> str:
    return f"{label:<{LABEL}}" + "".join(f"{v:>{CELL}}" for v in values)


def _rejected(get) -> str:
    count = _fmt(get("rejected"), "d")
    if not get("rejected"):
        return _row("Requests rejected", count)
    why = f"(context length {get('rejected_context_length')}, KV capacity {get('rejected_kv_capacity')})"
    return f"{_row('Requests rejected', count)}  {why}"


def saturation_line(summary: Mapping[str, Any]) -> str | None:
    """The one-line verdict when the run is saturated (``summary["saturated"]``), else None."""
    if not summary.get("saturated"):
        return None
    return (
        f"Saturated: over the second half of the sends requests arrived at "
        f"{summary['arrival_rate_second_half']:.2f} req/s and left at "
        f"{summary['departure_rate_second_half']:.2f} req/s; queues grow through the run"
    )


def format_summary(summary: Mapping[str, Any], out_dir: str | Path) -> str:
    """Render the headline metrics of a run as aligned text.

    Parameters
    ----------
    summary : mapping
        The run summary (``simcore.Result.summary``).  The latency columns are
        the mean and every configured percentile (``p<P>_*`` keys); missing
        keys and None values print as ``-``.  Request goodput is shown when an
        SLO is set (not None), rejection reasons when requests were rejected,
        and a saturation verdict when the run is saturated.
    out_dir : str or Path
        Where the result files were written.

    Returns
    -------
    str
        The table, without a trailing newline.
    """
    get = summary.get
    percentiles = percentile_names(summary)
    width = LABEL + CELL * (1 + len(percentiles))
    lines = [
        " replaysim result ".center(width, "="),
        _row("Requests completed", _fmt(get("completed"), "d")),
        _rejected(get),
        _row("Requests incomplete", _fmt(get("incomplete"), "d")),
        _row("Duration (s)", _fmt(get("duration_s"), ".3f")),
        _row("Request throughput (req/s)", _fmt(get("request_throughput"))),
    ]
    if get("request_goodput") is not None:
        lines.append(_row("Request goodput (req/s)", _fmt(get("request_goodput"))))
    lines += [
        _row("Output throughput (tok/s)", _fmt(get("output_throughput"))),
        _row("Latency (ms)", "mean", *percentiles),
    ]
    # With sessions (num_sessions set): the per-turn-group distributions after the others.
    split = [per_turn(m, g) for m in PER_TURN for g in TURN_GROUPS] if get("num_sessions") is not None else []
    for metric in (*DISTRIBUTIONS, *split):
        points = (_fmt(get(summary_key(p, metric))) for p in percentiles)
        lines.append(_row(f"  {metric.label}", _fmt(get(summary_key("mean", metric))), *points))
    lines.append(_row("TTFT stages, mean (ms)"))
    for stage in TTFT_STAGES:
        lines.append(_row(f"  {stage.removesuffix('_ms')}", _fmt(get(f"mean_{stage}"), ".3f")))
    if get("spec_decode_num_drafts") is not None:  # speculative decoding (docs/speculative.md)
        lines += [
            _row("Speculative decoding"),
            _row("  acceptance rate", _fmt(get("spec_decode_acceptance_rate"), ".3f")),
            _row("  mean acceptance length", _fmt(get("spec_decode_acceptance_length"), ".3f")),
            _row("  drafted / accepted tokens", f"{get('spec_decode_draft_tokens')}/{get('spec_decode_accepted_tokens')}"),
        ]
        positions = [key for key in summary if key.startswith("spec_decode_acceptance_rate_pos_")]
        if positions:
            lines.append(_row("  per-position acceptance", " ".join(_fmt(get(key), ".2f") for key in positions)))
    verdict = saturation_line(summary)
    lines += ["=" * width, *([verdict] if verdict else []), f"Output directory: {out_dir}"]
    return "\n".join(line.rstrip() for line in lines)
