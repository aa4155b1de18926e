"""Worker failures of the aggregated pool (docs/failures.md): a worker lost, its requests retried or failed.

Contract: ``@njit(cache=True)`` functions called by the engine's event loop
(``simcore.engine.nb._replay_nb``) at an instant t before its phases
(:func:`fail_step_nb`, inlined: it takes ``run`` and ``state``), by the send
phases (:func:`lose_nb` when no worker is up, :func:`retry_sends_nb` for the
retries at t).  A worker's status lives in the routing state
(``simcore.engine.router_nb``: ``W_READY`` or ``W_FAILED``), so the router
sends to the workers that are up.  This module's own state is
``Loop.fail`` (:func:`allocate_fail_nb`) and the retry heap
(``Loop.retry_key``/``retry_val``: one entry per request at most).

At an instant t, before the phases: workers whose repair ends at t are up
again (event ``ready``; a random failure's next gap starts), then the fixed
failures at t (in their order), then the random ones (by worker): a worker up
fails (event ``fail``): its pass is cut (its pass-log rows end at t), its
KV is gone and every request at it (running, waiting, in its tokenizer: in
that order, rank by rank) is lost: its tokens and instants after the send are
cleared, ``failures`` counts one more, and the client retries it after
``min(delay x 2^(i-1), max_delay)`` (retry i) while ``i <= max_retries``
(``on_failure: retry``), else takes it as failed (rejected at t; with
multi-turn sessions its session's next turn is released).  It is down for
``repair``.  A retry is a send of its own at its instant (phase (b)+(c),
after the table's sends, by row) under its first send number (its row, or
with sessions its send sequence number); its send instant stays the first.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from simcore.heap_nb import heap_pop_nb, heap_push_nb
from simcore.engine.router_nb import (
    W_FAILED, W_READY, route_lose_nb, set_worker_status_nb, worker_status_nb,
)
from simcore.engine.state import ARR_SIZE, PASS_LOG_ROWS, SEND_SIZE
from simcore.scheduler.kv_tree_nb import prefix_release_nb
from simcore.scheduler.nb import POLICY_SGLANG
from simcore.scheduler.radix_nb import radix_release_nb
from simcore.enums import PASS_END, PASS_START, PASS_WORKER

#: ``Router.fail`` members.
F_ON = 0
F_ACTION = 1  # FAIL_RETRY or FAIL_REJECT
F_RETRIES = 2
F_DELAY = 3  # ns
F_MAX_DELAY = 4  # ns
F_REPAIR = 5  # ns
F_GAPS = 6  # random gaps per worker (0: no random failure)
NUM_FAIL_PARAMS = 7
FAIL_RETRY = 0
FAIL_REJECT = 1

#: Scaling-log event of a failure (``simcore.engine.autoscale_nb.SCALE_EVENTS``); a repair is ``SCALE_READY``.
SCALE_FAIL = 4
_SCALE_READY = 1
_SCALE_START = 0

# ``Loop.fail``: header, then per worker its repair instant, next random failure, next gap.
_FIXED = 0  # next fixed failure
_RETRY_SIZE = 1  # retry heap entries
_COUNT = 2  # failures that took a worker down
_ROWS = 3  # scaling-log rows written
_HEADER = 4

_NO_CAP = np.iinfo(np.int64).max


@njit(cache=True)
def allocate_fail_nb(params, gaps, num_workers):
    """The failures state (empty when off), every worker up since 0.

    Parameters
    ----------
    params : ndarray(int64, ndim=1)
        ``Router.fail`` (``F_*``).
    gaps : ndarray(int64, ndim=1)
        ``Router.fail_gaps``: (workers x gaps,) the random failures' gaps, ns.
    num_workers : int
        Workers of the pool.

    Returns
    -------
    ndarray(int64, ndim=1)
    """
    if params[F_ON] == 0:
        return np.zeros(0, dtype=np.int64)
    st = np.full(_HEADER + 3 * num_workers, -1, dtype=np.int64)
    st[_FIXED] = 0
    st[_RETRY_SIZE] = 0
    st[_COUNT] = 0
    st[_ROWS] = 0
    for w in range(num_workers):
        st[_HEADER + w] = -1
        st[_HEADER + num_workers + w] = gaps[w * params[F_GAPS]] if params[F_GAPS] > 0 else -1
        st[_HEADER + 2 * num_workers + w] = 1
    return st


@njit(cache=True)
def fail_init_nb(st, log, num_workers):
    """The scaling log's first rows: every worker started and ready at 0.

    Parameters
    ----------
    st : ndarray(int64, ndim=1)
        The failures state (:func:`allocate_fail_nb`).
    log : ndarray(int64, ndim=2)
        The scaling log (``Logs.scale_log``: instant ns, worker, event).
    num_workers : int
        Workers of the pool.
    """
    for w in range(num_workers):
        _log_nb(st, log, 0, w, _SCALE_START)
        _log_nb(st, log, 0, w, _SCALE_READY)


@njit(cache=True)
def _log_nb(st, log, t, w, event):
    rows = st[_ROWS]
    if rows < log.shape[0]:
        log[rows, 0] = t
        log[rows, 1] = w
        log[rows, 2] = event
    st[_ROWS] = rows + 1  # counted past the end: the wrapper reruns with a larger log


@njit(cache=True)
def fail_log_full_nb(st, log):
    """Whether the scaling log overflowed (the run is repeated with a larger one).

    Parameters
    ----------
    st : ndarray(int64, ndim=1)
        The failures state (:func:`allocate_fail_nb`).
    log : ndarray(int64, ndim=2)
        The scaling log (``Logs.scale_log``: instant ns, worker, event).

    Returns
    -------
    bool
    """
    return st.shape[0] > 0 and st[_ROWS] > log.shape[0]


@njit(cache=True)
def fail_retries_nb(st):
    """Retries waiting in the heap.

    Parameters
    ----------
    st : ndarray(int64, ndim=1)
        The failures state (:func:`allocate_fail_nb`).

    Returns
    -------
    int
    """
    return st[_RETRY_SIZE] if st.shape[0] > 0 else 0


@njit(cache=True)
def fail_next_instant_nb(t, horizon, st, fail_at, num_workers):
    """The earliest of ``t`` (the next engine event, ``NO_CAP`` for none) and the failures' events before it;
    with no engine event, those up to ``horizon`` (the last receipt to come, -1 for none).

    Parameters
    ----------
    t : int
        The next engine event, ns (``NO_CAP``: none).
    horizon : int
        The last receipt to come, ns (-1: none).
    st : ndarray(int64, ndim=1)
        The failures state (:func:`allocate_fail_nb`).
    fail_at : ndarray(int64, ndim=1)
        ``Router.fail_at``: (2 m,) the fixed failures, instant ns and worker, by instant.
    num_workers : int
        Workers of the pool.

    Returns
    -------
    int
        ns.
    """
    limit = t if t != _NO_CAP else horizon + 1
    i = st[_FIXED]
    if 2 * i < fail_at.shape[0] and fail_at[2 * i] < limit and fail_at[2 * i] < t:
        t = fail_at[2 * i]
    for w in range(num_workers):
        repair = st[_HEADER + w]
        if repair >= 0 and repair < limit and repair < t:
            t = repair
        nxt = st[_HEADER + num_workers + w]
        if nxt >= 0 and nxt < limit and nxt < t:
            t = nxt
    return t


@njit(cache=True)
def retry_delay_nb(params, attempt):
    """Backoff before retry ``attempt`` (1, 2, ...): min(delay x 2^(attempt-1), max_delay), ns.

    Parameters
    ----------
    params : ndarray(int64, ndim=1)
        ``Router.fail`` (``F_DELAY``, ``F_MAX_DELAY``, ns).
    attempt : int
        The retry, from 1.

    Returns
    -------
    int
        ns.
    """
    delay = params[F_DELAY]
    for _ in range(attempt - 1):
        if delay >= params[F_MAX_DELAY]:
            break
        delay *= 2
    return min(delay, params[F_MAX_DELAY])


@njit(cache=True, inline="always")
def lose_nb(k, t, at_worker, run, state):
    """Request k is lost at t (``at_worker``: its worker failed; else none was up at its send): cleared, then
    retried or failed.

    Parameters
    ----------
    k : int
        Request row.
    t : int
        The instant, ns.
    at_worker : bool
        Its worker failed (else no worker was up at its send).
    run : Run
        The engine's inputs and outputs.
    state : LoopState
        The event loop's state.
    """
    requests, load, out, params = run.requests, run.load, run.out, run.router.fail
    rq, rk, lp = state.rq, state.rk, state.lp
    g = out.placed_rank[k]
    if at_worker:
        route_lose_nb(lp.route, k, g, requests.input_tokens[k], out.first_emit_ns[k] >= 0)
        if g >= 0 and rq.held[k] > 0:  # its KV is gone with the worker's
            if run.ranks.policy[g] == POLICY_SGLANG:
                radix_release_nb(run.prefix_cache, g, k, rq.held, rk.blocks_used)
            else:
                prefix_release_nb(run.prefix_cache, g, k, rq.held, rk.blocks_used)
    out.placed_rank[k] = -1
    off = requests.token_offset[k]
    if out.token_emit_ns.shape[0] > 0:
        for j in range(out.generated[k]):
            out.token_emit_ns[off + j] = -1
            out.token_recv_ns[off + j] = -1
    out.generated[k] = 0
    rq.computed[k] = 0
    rq.held[k] = 0
    rq.sched_n[k] = 0
    rq.drafts[k] = 0
    rq.planned[k] = 0
    if rq.sample_flag.shape[1] > 0:
        rq.sample_flag[0, k] = False
        rq.sample_flag[1, k] = False
    rq.wait_next[k] = -1
    rq.wait_prev[k] = -1
    out.arrival_ns[k] = -1
    out.first_admit_ns[k] = -1
    out.first_emit_ns[k] = -1
    out.cached_tokens[k] = 0
    out.failures[k] += 1
    st = lp.fail
    if params[F_ACTION] == FAIL_RETRY and out.failures[k] <= params[F_RETRIES]:
        st[_RETRY_SIZE] = heap_push_nb(lp.retry_key, lp.retry_val, st[_RETRY_SIZE],
                                       t + retry_delay_nb(params, out.failures[k]), k)
    else:  # failed: it ends at the client now
        out.reject_ns[k] = t
        out.progress[0] += 1
        if load.closed_loop:
            lp.counts[SEND_SIZE] = heap_push_nb(lp.send_key, lp.send_val, lp.counts[SEND_SIZE], t + load.think_ns, 0)
        if load.session_mode:  # its session's next turn is released (as by a rejection)
            lp.counts[SEND_SIZE] = heap_push_nb(lp.send_key, lp.send_val, lp.counts[SEND_SIZE], t, k)


@njit(cache=True, inline="always")
def _fail_worker_nb(w, t, run, state):
    """Worker w fails at t (module docstring)."""
    topology, ranks, out, logs, params = run.topology, run.ranks, run.out, run.logs, run.router.fail
    rq, rk, ps, lp = state.rq, state.rk, state.ps, state.lp
    st = lp.fail
    num_workers = topology.worker_role.shape[0]
    set_worker_status_nb(lp.route, w, W_FAILED)
    st[_COUNT] += 1
    st[_HEADER + w] = t + params[F_REPAIR]
    st[_HEADER + num_workers + w] = -1
    _log_nb(st, logs.scale_log, t, w, SCALE_FAIL)
    num_dp = topology.worker_num_ranks[w]
    if ps.pass_end[w] >= 0:  # the pass is cut: its log rows end now
        found = 0
        row = lp.counts[PASS_LOG_ROWS] - 1
        while found < num_dp and row >= 0 and logs.pass_log.shape[0] > 0:
            if logs.pass_log[row, PASS_WORKER] == w and logs.pass_log[row, PASS_START] == ps.pass_start[w]:
                logs.pass_log[row, PASS_END] = t
                found += 1
            row -= 1
        ps.pass_end[w] = -1
    ps.queued[w] = False
    first = topology.worker_first_rank[w]
    for g in range(first, first + num_dp):
        for i in range(rk.run_len[g]):
            lose_nb(rk.running[g, i], t, True, run, state)
        k = rk.wait_head[g]
        while k >= 0:
            nxt = rq.wait_next[k]
            lose_nb(k, t, True, run, state)
            k = nxt
        rk.run_len[g] = 0
        rk.wait_head[g] = -1
        rk.wait_tail[g] = -1
        rk.blocks_used[g] = 0
        rk.chunked[g] = -1
        rk.extend[g] = False
        rk.ratio[g] = ranks.ratio_params[g, 0]
    # Its tokenizer's jobs: the arrivals of requests sent to it, taken out of the heap.
    size = lp.counts[ARR_SIZE]
    keep = 0
    for i in range(size):
        k = lp.arr_val[i]
        if run.load.session_mode:  # keyed by send sequence number
            k = lp.seq_row[k]
        if out.placed_worker[k] == w:
            lose_nb(k, t, True, run, state)
        else:
            lp.arr_key[keep] = lp.arr_key[i]
            lp.arr_val[keep] = lp.arr_val[i]
            keep += 1
    if keep < size:  # heapified again from the entries kept
        n = keep
        keep = 0
        for i in range(n):
            key = lp.arr_key[i]
            val = lp.arr_val[i]
            keep = heap_push_nb(lp.arr_key, lp.arr_val, keep, key, val)
        lp.counts[ARR_SIZE] = keep
    servers = run.router.tok_workers
    for s in range(w * servers, (w + 1) * servers):
        lp.tok_free[s] = t


@njit(cache=True, inline="always")
def fail_step_nb(t, run, state):
    """Repairs, then fixed failures, then random failures at t (module docstring).

    Parameters
    ----------
    t : int
        The instant, ns.
    run : Run
        The engine's inputs and outputs.
    state : LoopState
        The event loop's state.
    """
    params, fail_at, gaps = run.router.fail, run.router.fail_at, run.router.fail_gaps
    lp, logs = state.lp, run.logs
    st = lp.fail
    num_workers = run.topology.worker_role.shape[0]
    for w in range(num_workers):
        if st[_HEADER + w] == t:
            st[_HEADER + w] = -1
            set_worker_status_nb(lp.route, w, W_READY)
            _log_nb(st, logs.scale_log, t, w, _SCALE_READY)
            gap = st[_HEADER + 2 * num_workers + w]
            if gap < params[F_GAPS]:
                st[_HEADER + num_workers + w] = t + gaps[w * params[F_GAPS] + gap]
                st[_HEADER + 2 * num_workers + w] = gap + 1
    while 2 * st[_FIXED] < fail_at.shape[0] and fail_at[2 * st[_FIXED]] == t:
        w = fail_at[2 * st[_FIXED] + 1]
        st[_FIXED] += 1
        if worker_status_nb(lp.route, w) == W_READY:
            _fail_worker_nb(w, t, run, state)
    for w in range(num_workers):
        if st[_HEADER + num_workers + w] == t and worker_status_nb(lp.route, w) == W_READY:
            _fail_worker_nb(w, t, run, state)


@njit(cache=True)
def any_up_nb(route, first, count):
    """Whether a worker of ``first .. first + count - 1`` takes requests.

    Parameters
    ----------
    route : ndarray(int64, ndim=1)
        The routing state (``Loop.route``; worker statuses, outstanding requests).
    first : int
        First worker.
    count : int
        Workers.

    Returns
    -------
    bool
    """
    for w in range(first, first + count):
        if worker_status_nb(route, w) == W_READY:
            return True
    return False


@njit(cache=True)
def retry_pop_nb(t, st, retry_key, retry_val):
    """The next retry at t (its row), or -1.

    Parameters
    ----------
    t : int
        The instant, ns.
    st : ndarray(int64, ndim=1)
        The failures state (:func:`allocate_fail_nb`).
    retry_key : ndarray(int64, ndim=1)
        The retry heap's instants, ns.
    retry_val : ndarray(int64, ndim=1)
        The retry heap's rows.

    Returns
    -------
    int
    """
    if st.shape[0] == 0 or st[_RETRY_SIZE] == 0 or retry_key[0] != t:
        return -1
    k = retry_val[0]
    st[_RETRY_SIZE] = heap_pop_nb(retry_key, retry_val, st[_RETRY_SIZE])
    return k


@njit(cache=True)
def fail_count_nb(st):
    """Failures that took a worker down.

    Parameters
    ----------
    st : ndarray(int64, ndim=1)
        The failures state (:func:`allocate_fail_nb`).

    Returns
    -------
    int
    """
    return st[_COUNT] if st.shape[0] > 0 else 0
