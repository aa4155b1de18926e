"""Autoscaling kernels: which replicas of the aggregated pool are up, decided at intervals (docs/autoscaling.md).

Contract: ``@njit(cache=True)`` functions called by the engine's event loop
(``simcore.engine.nb._replay_nb``) at an instant t, before its phases
(:func:`scale_step_nb`) and after them, before (e) (:func:`scale_drained_nb`).
A worker's status lives in the routing state (``simcore.engine.router_nb``:
``W_OFF``, ``W_STARTING``, ``W_READY``, ``W_DRAINING``), which the router
reads: it sends only to ready workers.  This module's own state is one int64
array (:func:`allocate_scale_nb`): the next decision instant, the scaling-log
rows written, then per worker the instant it becomes ready (-1: not starting).

The rules, at an instant t:

1. every starting worker whose ready instant is t becomes ready;
2. at a decision instant (``interval``, ``2 x interval``, ...): the load is
   the sum over the ready and draining workers of the metric (requests
   outstanding at the worker; or KV blocks in use / KV blocks, over its
   ranks), desired = ``ceil(load / target)`` clamped to
   ``[min_replicas, workers]`` (Kubernetes HPA's rule: current replicas x
   average / target); the active workers are the ready and starting ones.
   While fewer are active than desired: the lowest-index draining worker is
   ready again at once, else the lowest-index off worker starts (ready at
   ``t + startup``; at once when the startup is 0).  While more: the
   highest-index starting worker is off, else the highest-index ready worker
   drains (it takes no new request);
3. (after the phases at t) a draining worker with no request outstanding and
   no pass running is off.

The run starts with workers ``0 .. min_replicas - 1`` ready at 0, the others
off.  A scaling event is an instant only while another event is pending at or
after it: an engine event, or a client's receipt (the latest detokenizer
job's end).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from simcore.engine.router_nb import (
    W_DRAINING, W_OFF, W_READY, W_STARTING, set_worker_status_nb, worker_outstanding_nb, worker_status_nb,
)

#: Metric codes: the position in ``simcore.engine.settings.AUTOSCALE_METRICS``.
METRIC_NONE = 0
METRIC_OUTSTANDING = 1
METRIC_KV_USAGE = 2

#: ``Router.scale`` members.
P_METRIC = 0
P_INTERVAL = 1
P_MIN = 2
P_STARTUP = 3
NUM_PARAMS = 4

#: Scaling-log events (``Logs.scale_log`` column 2).
SCALE_START = 0  # the worker starts (model load and warm-up)
SCALE_READY = 1  # it takes requests
SCALE_DRAIN = 2  # it takes no new request; its own finish
SCALE_OFF = 3  # it is down (drained, or its start cancelled)
SCALE_EVENTS = ("start", "ready", "drain", "off", "fail")  # fail: simcore.engine.failures_nb (a repair: ready)

_NEXT = 0
_ROWS = 1
_READY_AT = 2

#: The status returned when the scaling log is full (the wrapper reruns with a larger one).
_NO_CAP = np.iinfo(np.int64).max


@njit(cache=True)
def allocate_scale_nb(params, num_workers):
    """The autoscaling state (empty when off).

    Parameters
    ----------
    params : ndarray(int64, ndim=1)
        ``Router.scale`` (``P_*``).
    num_workers : int
        Workers of the pool.

    Returns
    -------
    ndarray(int64, ndim=1)
    """
    if params[P_METRIC] == METRIC_NONE:
        return np.zeros(0, dtype=np.int64)
    st = np.full(_READY_AT + num_workers, -1, dtype=np.int64)
    st[_NEXT] = params[P_INTERVAL]
    st[_ROWS] = 0
    return st


@njit(cache=True)
def _log_nb(st, log, t, w, event):
    """Append one scaling-log row; False when the log is full."""
    rows = st[_ROWS]
    if rows >= log.shape[0]:
        return False
    log[rows, 0] = t
    log[rows, 1] = w
    log[rows, 2] = event
    st[_ROWS] = rows + 1
    return True


@njit(cache=True)
def scale_init_nb(route, st, params, num_workers, log):
    """The start: workers ``0 .. min - 1`` ready at 0, the others off. Returns False if the log is full.

    Parameters
    ----------
    route : ndarray(int64, ndim=1)
        The routing state (``Loop.route``; worker statuses, outstanding requests).
    st : ndarray(int64, ndim=1)
        The autoscaling state (:func:`allocate_scale_nb`).
    params : ndarray(int64, ndim=1)
        ``Router.scale``.
    num_workers : int
        Workers of the pool.
    log : ndarray(int64, ndim=2)
        The scaling log (``Logs.scale_log``: instant ns, worker, event).

    Returns
    -------
    bool
    """
    ok = True
    for w in range(num_workers):
        if w < params[P_MIN]:
            set_worker_status_nb(route, w, W_READY)
            ok = ok and _log_nb(st, log, 0, w, SCALE_START) and _log_nb(st, log, 0, w, SCALE_READY)
        else:
            set_worker_status_nb(route, w, W_OFF)
    return ok


@njit(cache=True)
def scale_rows_nb(st):
    """Scaling-log rows written.

    Parameters
    ----------
    st : ndarray(int64, ndim=1)
        The autoscaling state (:func:`allocate_scale_nb`).

    Returns
    -------
    int
    """
    return st[_ROWS] if st.shape[0] > 0 else 0


@njit(cache=True)
def scale_next_instant_nb(t, horizon, st, num_workers):
    """The earliest of ``t`` (the next engine event, ``NO_CAP`` for none) and the scaling events before it;
    with no engine event, those up to ``horizon`` (the last receipt to come, -1 for none).

    Parameters
    ----------
    t : int
        The next engine event, ns (``NO_CAP``: none).
    horizon : int
        The last receipt to come, ns (-1: none).
    st : ndarray(int64, ndim=1)
        The autoscaling state (:func:`allocate_scale_nb`).
    num_workers : int
        Workers of the pool.

    Returns
    -------
    int
        ns.
    """
    limit = t if t != _NO_CAP else horizon + 1
    if st[_NEXT] < limit and st[_NEXT] < t:
        t = st[_NEXT]
    for w in range(num_workers):
        ready_at = st[_READY_AT + w]
        if ready_at >= 0 and ready_at < limit and ready_at < t:
            t = ready_at
    return t


@njit(cache=True)
def _load_nb(route, metric, num_workers, worker_first_rank, worker_num_ranks, blocks_used, num_blocks):
    """The metric summed over the ready and draining workers, in worker order."""
    load = 0.0
    for w in range(num_workers):
        s = worker_status_nb(route, w)
        if s != W_READY and s != W_DRAINING:
            continue
        if metric == METRIC_OUTSTANDING:
            load += worker_outstanding_nb(route, w)
        elif metric == METRIC_KV_USAGE:
            used = 0
            capacity = 0
            for g in range(worker_first_rank[w], worker_first_rank[w] + worker_num_ranks[w]):
                used += blocks_used[g]
                capacity += num_blocks[g]
            load += used / capacity
        else:
            raise ValueError("unknown autoscaling metric code (not in simcore.engine.autoscale_nb)")
    return load


@njit(cache=True)
def _decide_nb(t, route, st, params, target, num_workers, load, log):
    """Rule 2 (module docstring): start, resume, cancel or drain workers toward the desired count."""
    ratio = load / target
    desired = np.int64(num_workers) if ratio >= num_workers else np.int64(np.ceil(ratio))  # bounded before the cast
    desired = min(max(desired, params[P_MIN]), num_workers)
    active = 0
    for w in range(num_workers):
        s = worker_status_nb(route, w)
        if s == W_READY or s == W_STARTING:
            active += 1
    ok = True
    while active < desired:
        pick = -1
        for w in range(num_workers):
            if worker_status_nb(route, w) == W_DRAINING:
                pick = w
                break
        if pick >= 0:
            set_worker_status_nb(route, pick, W_READY)
            ok = ok and _log_nb(st, log, t, pick, SCALE_READY)
        else:
            for w in range(num_workers):
                if worker_status_nb(route, w) == W_OFF:
                    pick = w
                    break
            ok = ok and _log_nb(st, log, t, pick, SCALE_START)
            if params[P_STARTUP] == 0:
                set_worker_status_nb(route, pick, W_READY)
                ok = ok and _log_nb(st, log, t, pick, SCALE_READY)
            else:
                set_worker_status_nb(route, pick, W_STARTING)
                st[_READY_AT + pick] = t + params[P_STARTUP]
        active += 1
    while active > desired:
        pick = -1
        for w in range(num_workers - 1, -1, -1):
            if worker_status_nb(route, w) == W_STARTING:
                pick = w
                break
        if pick >= 0:
            set_worker_status_nb(route, pick, W_OFF)
            st[_READY_AT + pick] = -1
            ok = ok and _log_nb(st, log, t, pick, SCALE_OFF)
        else:
            for w in range(num_workers - 1, -1, -1):
                if worker_status_nb(route, w) == W_READY:
                    pick = w
                    break
            set_worker_status_nb(route, pick, W_DRAINING)
            ok = ok and _log_nb(st, log, t, pick, SCALE_DRAIN)
        active -= 1
    return ok


@njit(cache=True)
def scale_step_nb(t, route, st, params, target, worker_first_rank, worker_num_ranks, blocks_used, num_blocks, log):
    """Rules 1 and 2 at instant t, before the phases. Returns False if the log is full.

    Parameters
    ----------
    t : int
        The instant, ns.
    route : ndarray(int64, ndim=1)
        The routing state (workers' statuses); updated.
    st : ndarray(int64, ndim=1)
        The autoscaling state; updated.
    params : ndarray(int64, ndim=1)
        ``Router.scale``: metric code, interval ns, min replicas, startup ns.
    target : float
        The metric's target per replica.
    worker_first_rank, worker_num_ranks : ndarray(int64, ndim=1)
        Each worker's ranks.
    blocks_used, num_blocks : ndarray(int64, ndim=1)
        Per rank: KV blocks in use, KV blocks.
    log : ndarray(int64, ndim=2)
        The scaling log (rows of instant, worker, ``SCALE_*``).

    Returns
    -------
    bool
    """
    num_workers = worker_first_rank.shape[0]
    ok = True
    for w in range(num_workers):
        if st[_READY_AT + w] == t:
            st[_READY_AT + w] = -1
            set_worker_status_nb(route, w, W_READY)
            ok = ok and _log_nb(st, log, t, w, SCALE_READY)
    if st[_NEXT] == t:
        st[_NEXT] = t + params[P_INTERVAL]
        load = _load_nb(route, params[P_METRIC], num_workers, worker_first_rank, worker_num_ranks, blocks_used,
                        num_blocks)
        ok = _decide_nb(t, route, st, params, target, num_workers, load, log) and ok
    return ok


@njit(cache=True)
def scale_drained_nb(t, route, st, pass_end, log):
    """Rule 3 at instant t, before (e): drained workers are off. Returns False if the log is full.

    Parameters
    ----------
    t : int
        The instant, ns.
    route : ndarray(int64, ndim=1)
        The routing state (``Loop.route``; worker statuses, outstanding requests).
    st : ndarray(int64, ndim=1)
        The autoscaling state (:func:`allocate_scale_nb`).
    pass_end : ndarray(int64, ndim=1)
        Per worker, its running pass's end (-1: idle).
    log : ndarray(int64, ndim=2)
        The scaling log (``Logs.scale_log``: instant ns, worker, event).

    Returns
    -------
    bool
    """
    ok = True
    for w in range(pass_end.shape[0]):
        if worker_status_nb(route, w) == W_DRAINING and worker_outstanding_nb(route, w) == 0 and pass_end[w] < 0:
            set_worker_status_nb(route, w, W_OFF)
            ok = ok and _log_nb(st, log, t, w, SCALE_OFF)
    return ok
