"""``vllm_bench.json``: a run's results in the shape of ``vllm bench serve --save-result``.

The document uses the key names and units of vLLM's serving benchmark result
JSON (``vllm/benchmarks/serve.py``: ``benchmark()`` plus the ``result_json``
header of ``main``), so a simulated run can be diffed with a measured one by
the tools already used for measured runs.  See ``docs/sweeps.md`` for the key
list and where the simulator's definitions differ.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

import simcore

MS_PER_S = 1000.0
#: Per-request arrays, written only with ``export.detailed=true`` (vLLM's ``--save-detailed``).
DETAILED_KEYS = ("input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times", "errors")
#: Distribution metrics, in vLLM's order (``--percentile-metrics ttft,tpot,itl,e2el``).
METRICS = ("ttft", "tpot", "itl", "e2el")


def _float_column(table: pa.Table, name: str) -> np.ndarray:
    return table.column(name).to_numpy(zero_copy_only=False).astype(np.float64)


def _itls_s(requests: pa.Table, tokens: pa.Table) -> list[list[float]]:
    """Gaps between consecutive receipts of each request's tokens, in seconds."""
    n = requests.num_rows
    if tokens is None or tokens.num_rows == 0:
        return [[] for _ in range(n)]
    row = pc.index_in(tokens.column("request_id"), value_set=requests.column("request_id"))
    row = row.to_numpy(zero_copy_only=False).astype(np.int64)
    index = tokens.column("index").to_numpy()
    received = _float_column(tokens, "received_ms")
    keep = ~np.isnan(received)
    row, index, received = row[keep], index[keep], received[keep]
    order = np.lexsort((index, row))
    row, received = row[order], received[order]
    same = row[1:] == row[:-1]
    gaps = (received[1:] - received[:-1])[same] / MS_PER_S
    owner = row[1:][same]
    bounds = np.searchsorted(owner, np.arange(n + 1))
    return [gaps[bounds[i]:bounds[i + 1]].tolist() for i in range(n)]


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
            peak_tokens = float(np.bincount(buckets, minlength=1).max()) if buckets.size else 0.0
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
    status = requests.column("status").cast(pa.string()).to_numpy(zero_copy_only=False)
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
        "model_id": None,
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
                "itls": _itls_s(requests, tokens),
                "latencies": np.where(completed & ~np.isnan(e2el), e2el / MS_PER_S, 0.0).tolist(),
                "start_times": np.where(np.isnan(send_ms), 0.0, send_ms / MS_PER_S).tolist(),
                "errors": ["" if s == "completed" else s for s in status.tolist()],
            }
        )
    for metric in METRICS:
        for stat in ("mean", "median", "std"):
            document[f"{stat}_{metric}_ms"] = summary.get(f"{stat}_{metric}_ms")
        for key, value in summary.items():
            if key.startswith("p") and key.endswith(f"_{metric}_ms") and key[1:].split("_", 1)[0].replace(".", "", 1).isdigit():
                document[key] = value
    return document
