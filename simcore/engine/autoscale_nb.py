"""Autoscaling kernels: which replicas of each pool are up, decided at intervals (docs/autoscaling.md).

Contract: ``@njit(cache=True)`` functions called by the engine's event loop
(``simcore.engine.nb._replay_nb``) at an instant t, before its phases
(:func:`scale_step_nb`) and after them, before (e) (:func:`scale_drained_nb`).
A worker's status lives in the routing state (``simcore.engine.router_nb``:
``W_OFF``, ``W_STARTING``, ``W_READY``, ``W_DRAINING``), which the router
reads: it sends only to ready workers.  This module's own state is one int64
array (:func:`allocate_scale_nb`): the scaling-log rows written, per pool
(0: the receiving pool, aggregated or P/D prefill; 1: the P/D decode pool)
its next decision instant (-1: not scaled) and the latency samples of its
interval (their sum in ns, as two int64 words, and count), then per worker the instant it becomes ready
(-1: not starting).  Each pool has its own parameters (``Router.scale``:
``NUM_PARAMS`` per pool) and target.

The rules, at an instant t:

1. every starting worker whose ready instant is t becomes ready;
2. at a pool's decision instant (``interval``, ``2 x interval``, ...), the
   receiving pool's first: the load is the sum over the pool's ready and
   draining workers of the metric (requests outstanding at the worker; or KV
   blocks in use / KV blocks, over its ranks), or for a latency metric
   (``ttft``, ``itl``) those workers' count x the mean of the samples since
   the previous decision, in ms (no sample: no decision); desired =
   ``ceil(load / target)`` clamped to ``[min_replicas, workers of the pool]``
   (Kubernetes HPA's rule: current replicas x average / target); the active
   workers are the pool's ready and starting ones.
   While fewer are active than desired: the lowest-index draining worker is
   ready again at once, else the lowest-index off worker starts (ready at
   ``t + startup``; at once when the startup is 0).  While more: the
   highest-index starting worker is off, else the highest-index ready worker
   drains (it takes no new request);
3. (after the phases at t) a draining worker with no request outstanding, no
   pass running and no KV transfer from or to its ranks is off.

A latency sample is taken at each token's emission (:func:`scale_sample_nb`):
its TTFT (emission - send) for a first token, its gap to the request's
previous emission for the others.  The run starts with each scaled pool's
first ``min_replicas`` workers ready at 0, the others off; an unscaled pool's
workers are ready at 0.  A scaling event is an instant only while another event is pending at or
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
METRIC_TTFT = 3
METRIC_ITL = 4

#: ``Router.scale`` members, per pool (pool p's at ``p x NUM_PARAMS``).
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

NUM_POOLS = 2
_ROWS = 0
_POOL = 1  # per pool: next decision (-1: not scaled), samples' sum (ns, as _HIGH x 2^62 + _SUM), their count
_NEXT = 0
_SUM = 1
_COUNT = 2
_HIGH = 3
_PER_POOL = 4
_READY_AT = _POOL + _PER_POOL * NUM_POOLS
#: The sum's low part stays below this (2^62): a sum of any length never wraps.
_CARRY = np.int64(1) << 62

#: The status returned when the scaling log is full (the wrapper reruns with a larger one).
_NO_CAP = np.iinfo(np.int64).max


@njit(cache=True)
def scale_on_nb(params):
    """Whether a pool is autoscaled.

    Parameters
    ----------
    params : ndarray(int64, ndim=1)
        ``Router.scale`` (``P_*`` per pool).

    Returns
    -------
    bool
    """
    for p in range(NUM_POOLS):
        if params[p * NUM_PARAMS + P_METRIC] != METRIC_NONE:
            return True
    return False


@njit(cache=True)
def allocate_scale_nb(params, num_workers):
    """The autoscaling state (empty when off).

    Parameters
    ----------
    params : ndarray(int64, ndim=1)
        ``Router.scale`` (``P_*`` per pool).
    num_workers : int
        Workers of the deployment.

    Returns
    -------
    ndarray(int64, ndim=1)
    """
    if not scale_on_nb(params):
        return np.zeros(0, dtype=np.int64)
    st = np.full(_READY_AT + num_workers, -1, dtype=np.int64)
    st[_ROWS] = 0
    for p in range(NUM_POOLS):
        base = _POOL + _PER_POOL * p
        st[base + _NEXT] = params[p * NUM_PARAMS + P_INTERVAL] if params[p * NUM_PARAMS + P_METRIC] != 0 else -1
        st[base + _SUM] = 0
        st[base + _COUNT] = 0
        st[base + _HIGH] = 0
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
def _pool_range(p, num_workers, num_decode):
    """Pool p's workers: (first, count)."""
    if p == 0:
        return 0, num_workers - num_decode
    return num_workers - num_decode, num_decode


@njit(cache=True)
def scale_init_nb(route, st, params, num_workers, num_decode, log):
    """The start: a scaled pool's first ``min`` workers ready at 0, its others off; an unscaled pool's
    workers ready at 0.  Returns False if the log is full.

    Parameters
    ----------
    route : ndarray(int64, ndim=1)
        The routing state (``Loop.route``; worker statuses, outstanding requests).
    st : ndarray(int64, ndim=1)
        The autoscaling state (:func:`allocate_scale_nb`).
    params : ndarray(int64, ndim=1)
        ``Router.scale``.
    num_workers : int
        Workers of the deployment.
    num_decode : int
        Of which the P/D decode pool's (the last ones; 0 when aggregated).
    log : ndarray(int64, ndim=2)
        The scaling log (``Logs.scale_log``: instant ns, worker, event).

    Returns
    -------
    bool
    """
    ok = True
    for p in range(NUM_POOLS):
        first, count = _pool_range(p, num_workers, num_decode)
        scaled = params[p * NUM_PARAMS + P_METRIC] != METRIC_NONE
        for w in range(first, first + count):
            if not scaled or w - first < params[p * NUM_PARAMS + P_MIN]:
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
def scale_sample_nb(st, params, metric, value):
    """A latency sample (ns) for every pool whose metric is ``metric`` (``METRIC_TTFT`` or ``METRIC_ITL``).

    Parameters
    ----------
    st : ndarray(int64, ndim=1)
        The autoscaling state (:func:`allocate_scale_nb`); updated.
    params : ndarray(int64, ndim=1)
        ``Router.scale``.
    metric : int
        The sample's kind.
    value : int
        The latency, ns.
    """
    for p in range(NUM_POOLS):
        if params[p * NUM_PARAMS + P_METRIC] == metric:
            base = _POOL + _PER_POOL * p
            st[base + _SUM] += value  # both below 2^62: no wrap
            if st[base + _SUM] >= _CARRY:
                st[base + _SUM] -= _CARRY
                st[base + _HIGH] += 1
            st[base + _COUNT] += 1


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
        Workers of the deployment.

    Returns
    -------
    int
        ns.
    """
    limit = t if t != _NO_CAP else horizon + 1
    for p in range(NUM_POOLS):
        nxt = st[_POOL + _PER_POOL * p + _NEXT]
        if nxt >= 0 and nxt < limit and nxt < t:
            t = nxt
    for w in range(num_workers):
        ready_at = st[_READY_AT + w]
        if ready_at >= 0 and ready_at < limit and ready_at < t:
            t = ready_at
    return t


@njit(cache=True)
def _load_nb(route, metric, first, count, worker_first_rank, worker_num_ranks, blocks_used, num_blocks):
    """The metric summed over the pool's ready and draining workers, in worker order."""
    load = 0.0
    for w in range(first, first + count):
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
def _decide_nb(t, route, st, params, base, first, count, load, target, log):
    """Rule 2 (module docstring) for the pool of workers ``first .. first + count - 1``: start, resume,
    cancel or drain workers toward the desired count."""
    ratio = load / target
    desired = np.int64(count) if ratio >= count else np.int64(np.ceil(ratio))  # bounded before the cast
    desired = min(max(desired, params[base + P_MIN]), count)
    active = 0
    for w in range(first, first + count):
        s = worker_status_nb(route, w)
        if s == W_READY or s == W_STARTING:
            active += 1
    ok = True
    while active < desired:
        pick = -1
        for w in range(first, first + count):
            if worker_status_nb(route, w) == W_DRAINING:
                pick = w
                break
        if pick >= 0:
            set_worker_status_nb(route, pick, W_READY)
            ok = ok and _log_nb(st, log, t, pick, SCALE_READY)
        else:
            for w in range(first, first + count):
                if worker_status_nb(route, w) == W_OFF:
                    pick = w
                    break
            ok = ok and _log_nb(st, log, t, pick, SCALE_START)
            if params[base + P_STARTUP] == 0:
                set_worker_status_nb(route, pick, W_READY)
                ok = ok and _log_nb(st, log, t, pick, SCALE_READY)
            else:
                set_worker_status_nb(route, pick, W_STARTING)
                st[_READY_AT + pick] = t + params[base + P_STARTUP]
        active += 1
    while active > desired:
        pick = -1
        for w in range(first + count - 1, first - 1, -1):
            if worker_status_nb(route, w) == W_STARTING:
                pick = w
                break
        if pick >= 0:
            set_worker_status_nb(route, pick, W_OFF)
            st[_READY_AT + pick] = -1
            ok = ok and _log_nb(st, log, t, pick, SCALE_OFF)
        else:
            for w in range(first + count - 1, first - 1, -1):
                if worker_status_nb(route, w) == W_READY:
                    pick = w
                    break
            set_worker_status_nb(route, pick, W_DRAINING)
            ok = ok and _log_nb(st, log, t, pick, SCALE_DRAIN)
        active -= 1
    return ok


@njit(cache=True)
def scale_step_nb(t, route, st, params, target, num_decode, worker_first_rank, worker_num_ranks, blocks_used,
                  num_blocks, log):
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
        ``Router.scale``: per pool, metric code, interval ns, min replicas, startup ns.
    target : ndarray(float64, ndim=1)
        Per pool, the metric's target per replica (latency metrics: ms).
    num_decode : int
        Workers of the P/D decode pool (the last ones; 0 when aggregated).
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
    for p in range(NUM_POOLS):
        pool = _POOL + _PER_POOL * p
        if st[pool + _NEXT] != t:
            continue
        base = p * NUM_PARAMS
        st[pool + _NEXT] = t + params[base + P_INTERVAL]
        first, count = _pool_range(p, num_workers, num_decode)
        metric = params[base + P_METRIC]
        if metric == METRIC_TTFT or metric == METRIC_ITL:
            samples = st[pool + _COUNT]
            total = float(st[pool + _HIGH]) * float(_CARRY) + float(st[pool + _SUM])
            mean_ms = total / float(samples) / 1e6 if samples > 0 else 0.0
            st[pool + _SUM] = 0
            st[pool + _HIGH] = 0
            st[pool + _COUNT] = 0
            if samples == 0:  # nothing measured over the interval: no decision
                continue
            serving = 0
            for w in range(first, first + count):
                s = worker_status_nb(route, w)
                if s == W_READY or s == W_DRAINING:
                    serving += 1
            load = serving * mean_ms
        else:
            load = _load_nb(route, metric, first, count, worker_first_rank, worker_num_ranks, blocks_used,
                            num_blocks)
        ok = _decide_nb(t, route, st, params, base, first, count, load, target[p], log) and ok
    return ok


@njit(cache=True)
def scale_drained_nb(t, route, st, pass_end, worker_first_rank, worker_num_ranks, inflight, log):
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
    worker_first_rank, worker_num_ranks : ndarray(int64, ndim=1)
        Each worker's ranks.
    inflight : ndarray(int64, ndim=1)
        Per rank, KV transfers from or to it under way (P/D).
    log : ndarray(int64, ndim=2)
        The scaling log (``Logs.scale_log``: instant ns, worker, event).

    Returns
    -------
    bool
    """
    ok = True
    for w in range(pass_end.shape[0]):
        if worker_status_nb(route, w) == W_DRAINING and worker_outstanding_nb(route, w) == 0 and pass_end[w] < 0:
            transfers = 0
            for g in range(worker_first_rank[w], worker_first_rank[w] + worker_num_ranks[w]):
                transfers += inflight[g]
            if transfers == 0:
                set_worker_status_nb(route, w, W_OFF)
                ok = ok and _log_nb(st, log, t, w, SCALE_OFF)
    return ok
