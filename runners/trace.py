"""``trace.json``: a run as a Chrome / Perfetto trace (``output.trace=true``).

The Trace Event Format (JSON object form: ``traceEvents``, ``displayTimeUnit``)
opens in Perfetto (https://ui.perfetto.dev) and ``chrome://tracing``.  Time
stamps are µs from the simulation's start (the tables' ms × 1000).

- One process per worker (``worker 0 (aggregated)``, ``worker 1 (decode)``):
  one thread per attention-DP rank holding its passes (complete events
  ``pass``, from start to the pass end, with the rank's batch and own time
  as arguments), from the pass table.
- In the same process, one thread per detokenizer server holding its jobs
  (``detokenize``): the tokens the client received at one instant from one
  server of the worker are one job (SPEC §7), which ends at that instant and
  starts its service earlier, the service recomputed from the job's tokens
  and the ``detokenization`` costs.  From the token table; none when the
  detokenizer is off (receipt = emission).
- In P/D, each KV transfer is an async span ``KV transfer`` (prefill worker
  -> decode worker) in the decode worker's process, from the request table.

The runner records the tables the trace needs (:func:`tables_needed`) and
writes only the ones the configuration asked for.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from simcore.arrow_np import pc
from simcore.client.api import server_index

TRACE_FILE = "trace.json"
#: Thread ids of detokenizer servers start here (rank threads are the rank index).
DETOK_TID = 10_000


def tables_needed(config) -> tuple[bool, bool]:
    """(passes, tokens): the tables a trace of the run ``config`` (a SimConfig) is built from."""
    return True, bool(config.detokenization.enabled)


def _np(table: pa.Table, name: str, dtype=float) -> np.ndarray:
    column = table.column(name)
    if column.null_count:
        column = pc.fill_null(column.cast(pa.float64()), float("nan"))
    return column.to_numpy(zero_copy_only=False).astype(dtype, copy=False)


def _us(ms: np.ndarray) -> np.ndarray:
    return np.round(ms * 1000.0, 3)


def _metadata(pid: int, tid: int | None, name: str, kind: str) -> dict[str, Any]:
    event = {"ph": "M", "pid": pid, "name": kind, "args": {"name": name}}
    if tid is not None:
        event["tid"] = tid
    return event


def _pass_events(passes: pa.Table) -> tuple[list[dict], dict[int, str], list[tuple[int, int]]]:
    pools = passes.column("pool").cast(pa.string()).to_pylist()
    worker = _np(passes, "worker", np.int64)
    rank = _np(passes, "rank", np.int64)
    start, end = _us(_np(passes, "start_ms")), _us(_np(passes, "end_ms"))
    columns = {name: _np(passes, name, np.int64) for name in
               ("num_prefill", "prefill_tokens", "num_decode", "decode_kv_tokens", "blocks_in_use")}
    own = _np(passes, "rank_time_ms")
    events, roles = [], {}
    for i in range(passes.num_rows):
        roles.setdefault(int(worker[i]), pools[i])
        if columns["num_prefill"][i] == 0 and columns["num_decode"][i] == 0:
            continue  # an empty rank of the worker's pass
        args = {name: int(values[i]) for name, values in columns.items()}
        args["rank_time_ms"] = float(own[i])
        events.append({"ph": "X", "name": "pass", "cat": "pass", "pid": int(worker[i]), "tid": int(rank[i]),
                       "ts": float(start[i]), "dur": float(end[i] - start[i]), "args": args})
    ranks = sorted({(int(w), int(r)) for w, r in zip(worker, rank)})
    return events, roles, ranks


def _detok_events(requests: pa.Table, tokens: pa.Table, detok, disaggregated: bool) -> list[dict]:
    if tokens.num_rows == 0:
        return []
    ids = requests.column("request_id")
    emitter = _np(requests, "decode_worker" if disaggregated else "worker")
    server = server_index(ids, detok.workers)
    generated = _np(requests, "generated_tokens", np.int64)
    requested = _np(requests, "output_tokens", np.int64)
    where = pc.index_in(tokens.column("request_id"), value_set=ids).to_numpy(zero_copy_only=False)
    received = _np(tokens, "received_ms")
    index = _np(tokens, "index", np.int64)
    keep = np.isfinite(received) & np.isfinite(emitter[where])
    where, received, index = where[keep], received[keep], index[keep]
    worker = emitter[where].astype(np.int64)
    srv = server[where]
    first = index == 0
    final = (index == requested[where] - 1) & (generated[where] == requested[where])
    order = np.lexsort((received, srv, worker))
    worker, srv, received, first, final, where = (a[order] for a in (worker, srv, received, first, final, where))
    key = np.stack([worker, srv]).T
    new = np.ones(received.size, dtype=bool)
    new[1:] = (key[1:] != key[:-1]).any(axis=1) | (received[1:] != received[:-1])
    starts = np.flatnonzero(new)
    bounds = np.append(starts, received.size)
    events = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        k = int(b - a)
        n_first, n_final = int(first[a:b].sum()), int(final[a:b].sum())
        service = (detok.base_ms + detok.per_output_us * k / 1000.0 + detok.first_output_us * n_first / 1000.0
                   + detok.final_output_us * n_final / 1000.0)
        end = float(np.round(received[a] * 1000.0, 3))
        events.append({"ph": "X", "name": "detokenize", "cat": "detokenizer", "pid": int(worker[a]),
                       "tid": DETOK_TID + int(srv[a]), "ts": round(end - service * 1000.0, 3),
                       "dur": round(service * 1000.0, 3),
                       "args": {"tokens": k, "requests": int(np.unique(where[a:b]).size),
                                "first_tokens": n_first, "final_tokens": n_final}})
    return events


def _transfer_events(requests: pa.Table) -> list[dict]:
    start, end = _np(requests, "transfer_start_ms"), _np(requests, "transfer_end_ms")
    prefill, decode = _np(requests, "prefill_worker"), _np(requests, "decode_worker")
    ids = requests.column("request_id").to_pylist()
    events = []
    for i in np.flatnonzero(np.isfinite(start) & np.isfinite(end) & np.isfinite(decode)):
        common = {"name": "KV transfer", "cat": "kv_transfer", "id": int(i), "pid": int(decode[i]), "tid": 0}
        events.append({**common, "ph": "b", "ts": float(np.round(start[i] * 1000.0, 3)),
                       "args": {"request_id": ids[i], "from_worker": int(prefill[i]), "to_worker": int(decode[i])}})
        events.append({**common, "ph": "e", "ts": float(np.round(end[i] * 1000.0, 3))})
    return events


def trace_document(config, requests: pa.Table, passes: pa.Table, tokens: pa.Table | None) -> dict[str, Any]:
    """The trace of a run (see the module docstring).

    Parameters
    ----------
    config : SimConfig
        The run's configuration (the detokenizer's costs and servers).
    requests, passes : pyarrow.Table
        The request and pass tables.
    tokens : pyarrow.Table or None
        The token table (needed when the detokenizer is on).

    Returns
    -------
    dict
        ``{"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}``.
    """
    disaggregated = config.engine.mode == "disaggregated"
    events, roles, ranks = _pass_events(passes)
    meta = []
    for worker, role in sorted(roles.items()):
        meta.append(_metadata(worker, None, f"worker {worker} ({role})", "process_name"))
        meta.append({"ph": "M", "pid": worker, "name": "process_sort_index", "args": {"sort_index": worker}})
    for worker, rank in ranks:
        meta.append(_metadata(worker, rank, f"rank {rank} passes", "thread_name"))
    detok = config.detokenization
    if detok.enabled:
        if tokens is None:
            raise ValueError("a trace with the detokenizer on needs the token table")
        jobs = _detok_events(requests, tokens, detok, disaggregated)
        events += jobs
        for worker, server in sorted({(e["pid"], e["tid"]) for e in jobs}):
            meta.append(_metadata(worker, server, f"detokenizer server {server - DETOK_TID}", "thread_name"))
    if disaggregated:
        events += _transfer_events(requests)
    events.sort(key=lambda e: (e["ts"], e["pid"], e.get("tid", 0)))
    return {"traceEvents": meta + events, "displayTimeUnit": "ms",
            "otherData": {"producer": "replaysim", "time_origin": "simulation start (ts in µs)"}}
