"""Autoscaling results (docs/autoscaling.md): the scaling table, replicas over time, GPU-seconds, SLO attainment.

The engine's scaling log (``EngineRun.scale_log``: instant, worker, event of
``simcore.engine.autoscale_nb.SCALE_EVENTS``) becomes the ``scaling`` table;
the summary reads it over the run's span, from 0 to its end: the last
instant a request ended at the client (last receipt or rejection), or the
time cap when some request is left incomplete.  A worker costs GPU time from
its start (0 for the first ``min_replicas``) to its ``off`` event or the
run's end, its starting time included: ``gpu_seconds`` = that time x
``attention_dp x timing.tp`` GPUs per replica (P/D: each pool's own, summed
over the workers in whole ns first).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from simcore.engine.autoscale_nb import SCALE_DRAIN, SCALE_EVENTS, SCALE_OFF, SCALE_READY, SCALE_START
from simcore.engine.failures_nb import SCALE_FAIL
from simcore.metrics.registry import slo_metrics

#: The summary keys autoscaling adds (docs/results.md).
SCALING_KEYS = ("gpu_seconds", "replica_seconds", "mean_ready_replicas", "max_ready_replicas", "scale_ups",
                "scale_downs", "slo_attainment")

SCALING_SCHEMA = pa.schema([
    pa.field("instant_ms", pa.float64()),
    pa.field("worker", pa.int64()),
    pa.field("event", pa.dictionary(pa.int8(), pa.string())),
])


def scaling_table(log: np.ndarray) -> pa.Table:
    """The scaling log as a table: ``instant_ms``, ``worker``, ``event`` (start, ready, drain, off).

    Parameters
    ----------
    log : ndarray(int64, ndim=2)
        The scaling log (``Logs.scale_log``: instant ns, worker, event).

    Returns
    -------
    pyarrow.Table
    """
    events = pa.DictionaryArray.from_arrays(pa.array(np.ascontiguousarray(log[:, 2], dtype=np.int8)),
                                            pa.array(list(SCALE_EVENTS)))
    return pa.Table.from_arrays(
        [pa.array(np.ascontiguousarray(log[:, 0]) / 1e6, type=pa.float64()),
         pa.array(np.ascontiguousarray(log[:, 1]), type=pa.int64()), events],
        schema=SCALING_SCHEMA,
    )


def run_end_ns(last_recv_ns: np.ndarray, completed: np.ndarray, reject_ns: np.ndarray, incomplete: bool,
               cap_ns: int | None) -> int:
    """The run's end (module docstring), ns: the last receipt of a completed request or rejection, or the cap.

    Parameters
    ----------
    last_recv_ns : ndarray(int64)
        Per request, its last receipt, ns (-1: none).
    completed : ndarray(bool)
        Per request, whether it completed.
    reject_ns : ndarray(int64)
        Per request, its rejection instant, ns (-1: not rejected).
    incomplete : bool
        The run stopped at its cap with requests unfinished.
    cap_ns : int or None
        The run's cap, ns.

    Returns
    -------
    int
        ns.
    """
    if incomplete and cap_ns is not None:
        return int(cap_ns)
    ends = np.concatenate([last_recv_ns[completed], reject_ns[reject_ns >= 0]])
    return int(ends.max()) if ends.size else 0


def ready_steps(log: np.ndarray, end_ns: int) -> tuple[np.ndarray, np.ndarray]:
    """Ready replicas as a step function over [0, end]: instants (ns) and the count from each on.

    Parameters
    ----------
    log : ndarray(int64, ndim=2)
        The scaling log (``Logs.scale_log``: instant ns, worker, event).
    end_ns : int
        The run's end, ns.

    Returns
    -------
    tuple of ndarray
        Instants (ns) and the ready count from each on.
    """
    delta = np.where(log[:, 2] == SCALE_READY, 1, 0) - np.where(
        (log[:, 2] == SCALE_DRAIN) | (log[:, 2] == SCALE_FAIL), 1, 0)
    keep = log[:, 0] <= end_ns
    instants, first = np.unique(log[keep, 0], return_index=True)
    level = np.cumsum(delta[keep])
    last = np.r_[first[1:], keep.sum()] - 1  # the level after an instant's last event
    return instants, level[last] if instants.size else level[:0]


def on_ns(log: np.ndarray, num_workers: int, end_ns: int) -> list[int]:
    """Per worker, ns from each start to its off (or the run's end), clipped to [0, end].

    Parameters
    ----------
    log : ndarray(int64, ndim=2)
        The scaling log (``Logs.scale_log``: instant ns, worker, event).
    num_workers : int
        Workers of the deployment.
    end_ns : int
        The run's end, ns.

    Returns
    -------
    list of int
        ns per worker.
    """
    total = [0] * num_workers
    since = [-1] * num_workers
    for t, w, event in log.tolist():
        t = min(t, end_ns)
        if event == SCALE_START:
            since[w] = t
        elif event == SCALE_OFF and since[w] >= 0:
            total[w] += t - since[w]
            since[w] = -1
    for w in range(num_workers):
        if since[w] >= 0:
            total[w] += end_ns - since[w]
    return total


def on_seconds(log: np.ndarray, num_workers: int, end_ns: int) -> float:
    """Worker-seconds from each start to its off (or the run's end), clipped to [0, end].

    Parameters
    ----------
    log : ndarray(int64, ndim=2)
        The scaling log (``Logs.scale_log``: instant ns, worker, event).
    num_workers : int
        Workers of the deployment.
    end_ns : int
        The run's end, ns.

    Returns
    -------
    float
        Worker-seconds.
    """
    return float(sum(on_ns(log, num_workers, end_ns)) / 1e9)


def slo_attainment(cols, goodput) -> float | None:
    """Requests that completed within every goodput SLO set, over all requests (None: no SLO set).

    Parameters
    ----------
    cols : RequestColumns
        The run's per-request columns.
    goodput : Mapping
        ``metrics.goodput``: the SLOs, ms.

    Returns
    -------
    float or None
    """
    if not goodput.enabled or cols.completed.shape[0] == 0:
        return None
    good = cols.completed.copy()
    for metric in slo_metrics():
        target = goodput.target(metric.column)
        if target is not None:
            values = getattr(cols, metric.column)
            good &= np.isnan(values) | (values <= target)
    return float(good.sum() / good.shape[0])


def scaling_summary(log: np.ndarray, cols, goodput, num_workers: int, gpus_per_replica,
                    cap_ns: int | None) -> dict:
    """The ``SCALING_KEYS`` of one autoscaled run.

    Parameters
    ----------
    log : ndarray(int64, ndim=2)
        The scaling log (``Logs.scale_log``: instant ns, worker, event).
    cols : RequestColumns
        The run's per-request columns.
    goodput : Mapping
        ``metrics.goodput``: the SLOs, ms.
    num_workers : int
        Workers of the pool.
    gpus_per_replica : int or sequence of int
        GPUs of one replica, or per worker (P/D: each pool's own).
    cap_ns : int or None
        The run's cap, ns.

    Returns
    -------
    dict
    """
    run = cols.run
    incomplete = bool((~cols.completed & (run.reject_ns < 0)).any())
    end = run_end_ns(cols.last_recv_ns, cols.completed, run.reject_ns, incomplete, cap_ns)
    log = log[log[:, 0] <= end]  # after the run's end: no cost, no replica
    instants, level = ready_steps(log, end)
    spans = np.diff(np.r_[instants, end])
    per_worker = on_ns(log, num_workers, end)
    replica_seconds = float(sum(per_worker) / 1e9)
    if np.ndim(gpus_per_replica) == 0:
        gpu_seconds = replica_seconds * gpus_per_replica
    else:  # per worker, in whole ns first
        gpu_seconds = float(sum(ns * int(g) for ns, g in zip(per_worker, gpus_per_replica)) / 1e9)
    after_start = log[:, 0] > 0
    return {
        "gpu_seconds": gpu_seconds,
        "replica_seconds": replica_seconds,
        "mean_ready_replicas": float(np.sum(level * spans) / end) if end > 0 else None,
        "max_ready_replicas": int(level.max()) if level.size else 0,
        "scale_ups": int(np.sum(after_start & (log[:, 2] == SCALE_START))),
        "scale_downs": int(np.sum(after_start & ((log[:, 2] == SCALE_DRAIN) | (
            (log[:, 2] == SCALE_OFF) & ~_drained(log))))),
        "slo_attainment": slo_attainment(cols, goodput),
    }


def _drained(log: np.ndarray) -> np.ndarray:
    """Per row: an ``off`` that ends a drain (else it cancels a start)."""
    drained = np.zeros(log.shape[0], dtype=np.bool_)
    draining = set()
    for i, (_, w, event) in enumerate(log):
        if event == SCALE_DRAIN:
            draining.add(int(w))
        elif event == SCALE_READY:
            draining.discard(int(w))
        elif event == SCALE_OFF and int(w) in draining:
            drained[i] = True
            draining.discard(int(w))
    return drained


#: The summary keys failures add (docs/failures.md).
FAILURE_KEYS = ("worker_failures", "failed_requests", "retried_requests", "retries", "lost_requests")


def failure_summary(log: np.ndarray, failures: np.ndarray, reject_ns: np.ndarray, retry: bool,
                    max_retries: int) -> dict:
    """The ``FAILURE_KEYS``: failures that took a worker down (by the cap), requests hit by one at least,
    requests resent after one at least, resends, and requests taken as failed (rejected at a failure).

    Parameters
    ----------
    log : ndarray(int64, ndim=2)
        The scaling log (``Logs.scale_log``: instant ns, worker, event).
    failures : ndarray(int64)
        Per request, the attempts lost to failures.
    reject_ns : ndarray(int64)
        Per request, its rejection instant, ns (-1: not rejected).
    retry : bool
        Lost requests are retried (else rejected).
    max_retries : int
        Retries per request at most.

    Returns
    -------
    dict
    """
    resent = np.minimum(failures, max_retries) if retry else np.zeros_like(failures)
    return {
        "worker_failures": int(np.sum(log[:, 2] == SCALE_FAIL)),
        "failed_requests": int(np.sum(failures > 0)),
        "retried_requests": int(np.sum(resent > 0)),
        "retries": int(resent.sum()),
        "lost_requests": int(np.sum((failures > 0) & (reject_ns >= 0))),
    }
