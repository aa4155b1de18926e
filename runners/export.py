"""Result exports in the shapes of benchmark clients: ``vllm bench serve`` and aiperf.

``vllm_bench.json``: a run's results in the shape of ``vllm bench serve --save-result``.

The document uses the key names and units of vLLM's serving benchmark result
JSON (``vllm/benchmarks/serve.py``: ``benchmark()`` plus the ``result_json``
header of ``main``), so a simulated run can be diffed with a measured one by
the tools already used for measured runs.  See ``docs/sweeps.md`` for the key
list and where the simulator's definitions differ.

``profile_export_aiperf.json`` / ``.csv``: the same run in the metric tags,
units and statistic blocks of aiperf's JSON and CSV exporters
(``aiperf/common/models/export_models.py``, ``aiperf/exporters/csv_exporter.py``;
``docs/results.md``).
"""

from __future__ import annotations

import csv
import io
from datetime import datetime
from typing import Any

import numpy as np
import pyarrow as pa

import simcore
from simcore.arrow_np import dictionary_strings, pc, to_numpy
from simcore.metrics.registry import DISTRIBUTIONS, ITL, TPOT, percentile_names, summary_key

VLLM_BENCH_FILE = "vllm_bench.json"
AIPERF_JSON_FILE = "profile_export_aiperf.json"
AIPERF_CSV_FILE = "profile_export_aiperf.csv"
#: Every file an export can write (a rerun without it removes an earlier run's copy).
EXPORT_FILES = (VLLM_BENCH_FILE, AIPERF_JSON_FILE, AIPERF_CSV_FILE)

MS_PER_S = 1000.0
#: Per-request arrays, written only with ``export.detailed=true`` (vLLM's ``--save-detailed``).
DETAILED_KEYS = ("input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times", "errors")


def _float_column(table: pa.Table, name: str) -> np.ndarray:
    return to_numpy(table.column(name)).astype(np.float64, copy=False)


def _status(requests: pa.Table) -> np.ndarray:
    """Each request's status name (object array), read without pyarrow's pandas shim."""
    return dictionary_strings(requests.column("status"))


def _chunked(result: simcore.Result) -> bool:
    """Whether the run speculates: a pass's tokens of a request then reach the client as one chunk,
    and the tools count one inter-token gap per chunk (docs/speculative.md)."""
    return any(pool.speculative is not None for pool in result.config.engine.pools)


def _gaps_s(requests: pa.Table, tokens: pa.Table | None, chunks: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Gaps between consecutive receipts of each request's tokens, in seconds.

    Returns the owner (request-table row) of every gap, non-decreasing, and
    the gaps in receipt order within each request.  ``chunks``: tokens received
    at the instant of the one before them are in its chunk (no gap of their own).
    """
    if tokens is None or tokens.num_rows == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.float64)
    row = pc.index_in(tokens.column("request_id"), value_set=requests.column("request_id"))
    row = row.to_numpy(zero_copy_only=False).astype(np.int64)
    index = tokens.column("index").to_numpy()
    received = _float_column(tokens, "received_ms")
    keep = ~np.isnan(received)
    row, index, received = row[keep], index[keep], received[keep]
    order = np.lexsort((index, row))
    row, received = row[order], received[order]
    same = row[1:] == row[:-1]
    gaps = received[1:] - received[:-1]
    if chunks:
        same &= gaps != 0
    return row[1:][same], gaps[same] / MS_PER_S


def _itls_s(requests: pa.Table, tokens: pa.Table | None, chunks: bool = False) -> list[list[float]]:
    """vLLM's ``itls``: one list of gaps (s) per request, in request-table order."""
    owner, gaps = _gaps_s(requests, tokens, chunks)
    bounds = np.searchsorted(owner, np.arange(requests.num_rows + 1))
    return [gaps[bounds[i]:bounds[i + 1]].tolist() for i in range(requests.num_rows)]


def _most_common_count(values: np.ndarray, span: int) -> int:
    """How often the most frequent of ``values`` (non-empty, in ``[0, span)``) occurs.

    A table of ``span`` counters when that is no larger than the values
    themselves; otherwise the distinct values are counted, so that memory stays
    bounded by the tokens and not by the simulated seconds (a long, sparse run).
    """
    if span <= 2 * values.size:
        return int(np.bincount(values, minlength=1).max())
    return int(np.unique(values, return_counts=True)[1].max())


def _peaks(send_ms: np.ndarray, last_ms: np.ndarray, completed: np.ndarray,
           requests: pa.Table, tokens: pa.Table | None) -> tuple[float | None, int]:
    """vLLM's ``max_output_tokens_per_s`` (None without tokens) and ``max_concurrent_requests`` over completed requests."""
    if not completed.any():
        return (None if tokens is None else 0.0), 0
    start, end = send_ms[completed], last_ms[completed]
    origin = start.min()
    peak_tokens = None if tokens is None else 0.0
    if tokens is not None and tokens.num_rows:
        done_ids = requests.column("request_id").filter(pa.array(completed))
        mine = pc.is_in(tokens.column("request_id"), value_set=done_ids).to_numpy(zero_copy_only=False)
        received = _float_column(tokens, "received_ms")[mine]
        received = received[~np.isnan(received)]
        if received.size:
            buckets = np.floor((received - origin) / MS_PER_S).astype(np.int64)
            span = int(np.ceil((end.max() - origin) / MS_PER_S)) + 1
            buckets = buckets[(buckets >= 0) & (buckets < span)]
            peak_tokens = float(_most_common_count(buckets, span)) if buckets.size else 0.0
    # Half-open [send, last receipt): a departure at t precedes an arrival at t.
    times = np.concatenate((start, end))
    deltas = np.concatenate((np.ones(start.size, np.int64), -np.ones(end.size, np.int64)))
    order = np.lexsort((deltas, times))
    peak_concurrency = int(np.cumsum(deltas[order]).max())
    return peak_tokens, peak_concurrency


def vllm_bench_document(result: simcore.Result, tokens: pa.Table | None, *, detailed: bool = True) -> dict[str, Any]:
    """The ``vllm bench serve`` result JSON of one simulated run.

    Parameters
    ----------
    result : simcore.Result
        A finished run.
    tokens : pyarrow.Table or None
        Its per-token table (``TOKENS_SCHEMA``); needed for ``itls`` and
        ``max_output_tokens_per_s`` (null without it: the bounded output mode).
    detailed : bool
        Add the per-request arrays (``DETAILED_KEYS``), as ``--save-detailed``.

    Returns
    -------
    dict
        Header (``date``, ``endpoint_type``, ``backend``, ``label``,
        ``model_id``, ``tokenizer_id``, ``num_prompts``, ``request_rate``:
        req/s or ``"inf"``, ``burstiness``, ``max_concurrency``), counts and
        throughputs (``duration`` s, ``completed``, ``failed``,
        ``total_input_tokens``, ``total_output_tokens``,
        ``request_throughput`` req/s, ``request_goodput`` req/s,
        ``output_throughput`` and ``total_token_throughput`` tok/s,
        ``max_output_tokens_per_s``, ``max_concurrent_requests``), then
        ``{mean,median,std,p<P>}_{ttft,tpot,itl,e2el}_ms`` in ms.  Per-request
        arrays are in request-table order; times are in **seconds**
        (``ttfts``, ``itls``, ``latencies``, ``start_times``).
    """
    summary = result.summary
    cfg = result.config
    requests = result.requests
    status = _status(requests)
    completed = status == "completed"
    send_ms = _float_column(requests, "send_ms")
    last_ms = _float_column(requests, "last_token_ms")
    open_loop = cfg.load.request_rate is not None
    peak_tokens, peak_concurrency = _peaks(send_ms, last_ms, completed, requests, tokens)
    document: dict[str, Any] = {
        "date": datetime.now().strftime("%Y%m%d-%H%M%S"),
        "endpoint_type": "replaysim",
        "backend": "replaysim",
        "label": None,
        "model_id": cfg.timing.model,
        "tokenizer_id": None,
        "num_prompts": summary["num_requests"],
        "request_rate": cfg.load.request_rate if open_loop else "inf",
        "burstiness": cfg.load.burstiness,
        "max_concurrency": cfg.load.concurrency if cfg.load.closed_loop else None,
        "duration": summary["duration_s"],
        "completed": summary["completed"],
        "failed": summary["num_requests"] - summary["completed"],
        "total_input_tokens": summary["total_input_tokens"],
        "total_output_tokens": summary["total_output_tokens"],
        "request_throughput": summary["request_throughput"],
        "request_goodput": summary["request_goodput"],
        "output_throughput": summary["output_throughput"],
        "total_token_throughput": summary["total_token_throughput"],
        "max_output_tokens_per_s": peak_tokens,
        "max_concurrent_requests": peak_concurrency,
    }
    if detailed:
        ttft = _float_column(requests, "ttft_ms")
        e2el = _float_column(requests, "e2el_ms")
        generated = requests.column("generated_tokens").to_numpy()
        document.update(
            {
                "input_lens": requests.column("input_tokens").to_pylist(),
                "output_lens": np.where(completed, generated, 0).tolist(),
                "ttfts": np.where(np.isnan(ttft), 0.0, ttft / MS_PER_S).tolist(),
                "itls": _itls_s(requests, tokens, _chunked(result)),
                "latencies": np.where(completed & ~np.isnan(e2el), e2el / MS_PER_S, 0.0).tolist(),
                "start_times": np.where(np.isnan(send_ms), 0.0, send_ms / MS_PER_S).tolist(),
                "errors": ["" if s == "completed" else s for s in status.tolist()],
            }
        )
    percentiles = percentile_names(summary)
    for metric in DISTRIBUTIONS:
        if metric.vllm is None:  # no such metric in vLLM's result JSON
            continue
        for stat in ("mean", "median", "std", *percentiles):
            document[f"{stat}_{metric.vllm}_{metric.unit}"] = summary.get(summary_key(stat, metric))
    if _chunked(result) and tokens is not None and ITL.vllm is not None:
        # vLLM's ITL statistics are over its chunks' gaps (of the completed requests), ms
        owner, gaps = _gaps_s(requests, tokens, chunks=True)
        gaps = gaps[completed[owner]] * MS_PER_S
        stats = dict.fromkeys(("mean", "median", "std", *percentiles))
        if gaps.size:
            points = np.percentile(gaps, [50, *(float(p[1:]) for p in percentiles)])
            stats = dict(zip(stats, (float(np.mean(gaps)), float(points[0]), float(np.std(gaps)),
                                     *(float(point) for point in points[1:]))))
        for stat, value in stats.items():
            document[f"{stat}_{ITL.vllm}_{ITL.unit}"] = value
    return document


# ---------------------------------------------------------------- aiperf

#: aiperf's statistic keys of a record metric, in its JSON field order (``JsonMetricResult``).
AIPERF_PERCENTILES = (1, 5, 10, 25, 50, 75, 90, 95, 99)
#: Its CSV column order (``STAT_KEYS``).
AIPERF_CSV_STATS = ("avg", "min", "max", *(f"p{p}" for p in AIPERF_PERCENTILES), "std")
#: The distributions aiperf has a tag for (the others are left out of its export).
_AIPERF_DISTRIBUTIONS = tuple(metric for metric in DISTRIBUTIONS if metric.aiperf is not None)
_DISTRIBUTION_TAGS = {metric.aiperf: (metric.aiperf_header, metric.unit) for metric in _AIPERF_DISTRIBUTIONS}
#: tag -> (header, display unit), in the order of aiperf's ``JsonExportData`` fields, then
#: the tags of registered distributions that are not among those fields.
AIPERF_METRICS = {
    "request_throughput": ("Request Throughput", "requests/sec"),
    "request_latency": _DISTRIBUTION_TAGS["request_latency"],
    "request_count": ("Request Count", "requests"),
    "time_to_first_token": _DISTRIBUTION_TAGS["time_to_first_token"],
    "inter_token_latency": _DISTRIBUTION_TAGS["inter_token_latency"],
    "output_token_throughput": ("Output Token Throughput", "tokens/sec"),
    "output_token_throughput_per_user": ("Output Token Throughput Per User", "tokens/sec/user"),
    "output_sequence_length": ("Output Sequence Length", "tokens"),
    "input_sequence_length": ("Input Sequence Length", "tokens"),
    "goodput": ("Goodput", "requests/sec"),
    "good_request_count": ("GoodRequestCount", "requests"),
    "output_token_count": ("Output Token Count", "tokens"),
    "min_request_timestamp": ("Minimum Request Timestamp", "ns"),
    "max_response_timestamp": ("Maximum Response Timestamp", "ns"),
    "inter_chunk_latency": _DISTRIBUTION_TAGS["inter_chunk_latency"],
    "total_output_tokens": ("Total Output Tokens", "tokens"),
    "benchmark_duration": ("Benchmark Duration", "sec"),
    "total_isl": ("Total Input Sequence Length", "tokens"),
    "total_osl": ("Total Output Sequence Length", "tokens"),
    "error_request_count": ("Error Request Count", "requests"),
}
AIPERF_METRICS |= {tag: header for tag, header in _DISTRIBUTION_TAGS.items() if tag not in AIPERF_METRICS}


def _record_block(unit: str, values: np.ndarray) -> dict[str, Any]:
    """aiperf's statistics of a record metric: numpy-linear percentiles, population std."""
    if values.size == 0:
        return {"unit": unit}
    points = np.percentile(values, AIPERF_PERCENTILES)
    block: dict[str, Any] = {"unit": unit, "avg": float(np.mean(values))}
    block.update({f"p{p}": float(v) for p, v in zip(AIPERF_PERCENTILES, points)})
    is_int = values.dtype.kind == "i"
    block["min"] = int(values.min()) if is_int else float(values.min())
    block["max"] = int(values.max()) if is_int else float(values.max())
    block["std"] = float(np.std(values))
    return block


def _itl_block(summary: dict[str, Any], requests: pa.Table, tokens: pa.Table | None, chunks: bool = False) -> dict[str, Any]:
    """``inter_chunk_latency``: the pooled gaps (one chunk per token; ``chunks``: per received chunk),
    from the tokens when kept.

    Without per-token receipts the summary's ITL statistics are used: mean,
    min, max, std and those of aiperf's percentiles that ``metrics.percentiles``
    holds (the others are left out, as aiperf leaves out unset keys).
    """
    if tokens is not None:
        status = _status(requests)
        owner, gaps = _gaps_s(requests, tokens, chunks)
        return _record_block(ITL.unit, gaps[status[owner] == "completed"] * MS_PER_S)
    block: dict[str, Any] = {"unit": ITL.unit}
    if summary.get(summary_key("mean", ITL)) is None:
        return block
    block["avg"] = summary[summary_key("mean", ITL)]
    points = {f"p{p}": summary_key(f"p{p}", ITL) for p in AIPERF_PERCENTILES}
    block.update({point: summary[key] for point, key in points.items() if key in summary})
    block.update({stat: summary[summary_key(stat, ITL)] for stat in ("min", "max", "std")})
    return block


def aiperf_document(result: simcore.Result, tokens: pa.Table | None) -> dict[str, Any]:
    """``profile_export_aiperf.json`` of one simulated run (aiperf's metric tags, units, statistics).

    Record metrics (one value per completed request; ``inter_chunk_latency``
    pooled over their gaps) get aiperf's statistic block ``unit``, ``avg``,
    ``p1`` ... ``p99``, ``min``, ``max``, ``std``; aggregate and derived
    metrics ``unit`` and ``avg``.  aiperf's ``inter_token_latency`` is the
    per-request average, replaysim's TPOT; ``inter_chunk_latency`` the gaps
    (replaysim's ITL).  Timestamps are simulated ns from the simulation start.
    ``time_to_second_token`` is left out.

    Parameters
    ----------
    result : simcore.Result
        A finished run.
    tokens : pyarrow.Table or None
        Its per-token table, for exact ``inter_chunk_latency`` percentiles.

    Returns
    -------
    dict
        The metric blocks by tag (only those that apply), then
        ``input_config`` (``endpoint.model_names`` from ``timing.model`` when
        set), ``was_cancelled`` and ``error_summary`` (counts of rejected and
        incomplete requests).
    """
    summary = result.summary
    requests = result.requests
    status = _status(requests)
    done = status == "completed"

    def column(name: str) -> np.ndarray:
        values = requests.column(name).to_numpy(zero_copy_only=False)[done]
        return values[~np.isnan(values)] if values.dtype.kind == "f" else values

    blocks: dict[str, dict[str, Any]] = {
        metric.aiperf: _record_block(metric.unit, column(metric.column)) if metric.column
        else _itl_block(summary, requests, tokens, _chunked(result))
        for metric in _AIPERF_DISTRIBUTIONS
    }
    tpot = column(TPOT.column)
    blocks |= {
        "output_token_throughput_per_user": _record_block("tokens/sec/user", MS_PER_S / tpot[tpot > 0]),
        "output_sequence_length": _record_block("tokens", column("generated_tokens")),
        "input_sequence_length": _record_block("tokens", column("input_tokens")),
        "output_token_count": _record_block("tokens", column("generated_tokens")),
        "request_count": {"unit": "requests", "avg": summary["completed"]},
    }
    derived = {
        "request_throughput": summary["request_throughput"],
        "output_token_throughput": summary["output_throughput"],
        "benchmark_duration": summary["duration_s"],
        "total_output_tokens": summary["total_output_tokens"],
        "total_isl": summary["total_input_tokens"],
        "total_osl": summary["total_output_tokens"],
    }
    if summary["request_goodput"] is not None:
        derived["goodput"] = summary["request_goodput"]
        derived["good_request_count"] = round(summary["request_goodput"] * summary["duration_s"])
    if done.any():
        derived["min_request_timestamp"] = int(round(np.nanmin(_float_column(requests, "send_ms")) * 1e6))
        derived["max_response_timestamp"] = int(round(np.nanmax(column("last_token_ms")) * 1e6))
    errors = int((~done).sum())
    if errors:
        derived["error_request_count"] = errors
    for tag, value in derived.items():
        if value is not None:
            blocks[tag] = {"unit": AIPERF_METRICS[tag][1], "avg": value}
    document: dict[str, Any] = {tag: blocks[tag] for tag in AIPERF_METRICS if tag in blocks}
    model = result.config.timing.model
    document["input_config"] = {"endpoint": {"model_names": [model] if model else []}}
    document["was_cancelled"] = False
    document["error_summary"] = [
        {"error_details": {"code": None, "type": kind, "message": f"{kind} by the simulated engine"}, "count": count}
        for kind in ("rejected", "incomplete")
        if (count := int((status == kind).sum()))
    ]
    return document


def _csv_number(value: Any) -> str:
    """aiperf's CSV number format: integers as they are, other numbers with two decimals."""
    if value is None:
        return ""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return str(int(value))
    return f"{float(value):.2f}"


def aiperf_csv(document: dict[str, Any]) -> str:
    """``profile_export_aiperf.csv``: aiperf's two sections from :func:`aiperf_document`.

    Metrics with percentiles first (``Metric,avg,min,max,p1,...,p99,std``), a
    blank row, then the others (``Metric,Value``); rows sorted by tag, each
    named by its header and ``(unit)`` unless the unit is requests.
    """
    def name(tag: str) -> str:
        header, unit = AIPERF_METRICS[tag]
        return header if unit in ("count", "requests") else f"{header} ({unit})"

    tags = sorted(tag for tag in AIPERF_METRICS if tag in document)
    with_points = [t for t in tags if any(f"p{p}" in document[t] for p in AIPERF_PERCENTILES)]
    single = [t for t in tags if t not in with_points]
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    if with_points:
        writer.writerow(["Metric", *AIPERF_CSV_STATS])
        for tag in with_points:
            writer.writerow([name(tag), *(_csv_number(document[tag].get(stat)) for stat in AIPERF_CSV_STATS)])
        if single:
            writer.writerow([])
    if single:
        writer.writerow(["Metric", "Value"])
        for tag in single:
            writer.writerow([name(tag), _csv_number(document[tag].get("avg"))])
    return buffer.getvalue()
