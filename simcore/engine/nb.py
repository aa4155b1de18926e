"""Engine replay kernel: the discrete-event loop over engine passes (SPEC §2-7, 9).

Contract
--------
* Every function is ``@njit(cache=True)``; arguments are contiguous numpy
  arrays, scalars and the NamedTuples of ``simcore.engine.state`` (typed
  state, declared once), never Python objects.  The entry points take the
  typed state; the event loop (``_replay_nb``) takes it with its own state
  (allocated once per run) and calls one inlined function per phase
  (``simcore.engine.phases_nb``), on
  borrowed views of the arrays (``borrow_nb``).  Requests
  are a struct of arrays indexed by row ``k`` (= send sequence number);
  instants are int64 ns with ``-1`` for "not yet".
* Outputs are caller-allocated arrays filled in place; the kernel returns a
  status code (``OK``, ``PASS_LOG_FULL``, ``BAD_TIMING``) and the number of
  rows written to the logs.
* Tokens of request ``k`` live at ``token_offset[k] .. token_offset[k + 1]``
  in the per-token arrays.  In the bounded output mode there are none: each
  pass's receipts are folded into per-request statistics
  (``simcore.receipts_nb.stream_receipts_nb``) at the pass end.
* ``detok_mode``: ``DETOK_OFF`` (receipt = emission), ``DETOK_IN_KERNEL``
  (per-server FIFO evaluated at every pass end, :func:`simcore.client.nb.detokenize_pass_nb`:
  the one place the recurrence is written).

The equal-time rule of SPEC §5 is the loop in ``_replay_nb``: at an
instant t it repeats (a) pass ends by worker, (b)+(c) receipts releasing sends
and the sends themselves in table order, (d) tokenizer jobs, engine arrivals
in send order and KV-transfer ends in handoff order, until nothing is left at t; then (e) idle workers start passes.
Receipts are known when their pass ends, so a closed-loop send is queued then,
at ``receipt + think``, which is the same instant SPEC §2 gives it.

Asynchronous scheduling (``worker_async``, docs/semantics.md): at (e) a worker
whose pass started at t also builds the next pass, which (a) starts when the
running one ends; scheduled tokens count as computed when built, and the
tokens sampled by each of the two passes are marked in per-request slots.

Multi-turn sessions (``session_mode``, docs/semantics.md): rows are turns and
the send order follows receipts, so the table-order sends are idle and
``simcore.engine.sessions_nb`` sends rows from a heap at (c); each request's
end at the client (final receipt or rejection) is queued in the send heap as
a release (instant, row), and the send sequence number (``send_seq``) gives
the placement and the arrival order.

Steady decode: with one synchronous vLLM or TensorRT-LLM rank, a pass that
nothing can change (no event before its end, no waiting request, no first or
last token, no new KV block) is ended and its identical successor started by a
short loop at the top of the event loop, without the event scan and the batch
builder; it writes exactly what the general loop would.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange, typeof, types
from numba.core import cgutils
from numba.extending import intrinsic

from simcore.scheduler.offload_nb import (
    offload_enabled_nb, offload_loads_end_nb, offload_loads_pending_nb, offload_next_event_nb,
)
from simcore.scheduler.nb import ORDER_RANDOM, POLICY_SGLANG
from simcore.heap_nb import heap_push_nb
from simcore.engine.sessions_nb import session_next_instant_nb, session_start_nb
from simcore.enums import (  # noqa: F401  shared with the client and metrics stages
    DETOK_OFF, DETOK_IN_KERNEL, OUT_FIRST, OUT_FINAL,
    ROLE_AGGREGATED, ROLE_PREFILL, ROLE_DECODE, PASS_WORKER, PASS_RANK, PASS_START, PASS_END,
    PASS_NUM_PREFILL, PASS_PREFILL_TOKENS, PASS_PREFILL_KV_TOKENS, PASS_NUM_DECODE,
    PASS_DECODE_KV_TOKENS, PASS_BLOCKS_IN_USE, PASS_LOG_COLUMNS,
)
from simcore.engine.state import (
    ARR_SIZE, NEXT_ROW, NUM_COUNTS, NUM_EMITTED, PASS_LOG_ROWS, SEND_SIZE, SESS_SIZE, XFER_SIZE, DetokBuffers, Loop,
    LoopState, PassState, RankState, RequestState, Run,
)
from simcore.enums import RANK_ROUND_ROBIN, ROUTE_ROUND_ROBIN
from simcore.engine.router_nb import allocate_route_nb
from simcore.engine.failures_nb import (
    F_ON, allocate_fail_nb, fail_init_nb, fail_log_full_nb, fail_next_instant_nb, fail_retries_nb, fail_step_nb,
)
from simcore.engine.autoscale_nb import (
    allocate_scale_nb, scale_drained_nb, scale_init_nb, scale_next_instant_nb, scale_on_nb, scale_step_nb,
)
from simcore.engine.phases_nb import (  # noqa: F401  BAD_TIMING: the status codes, read by the wrapper
    BAD_TIMING, NO_CAP, OK, PASS_LOG_FULL, SCALE_LOG_FULL, _arrivals_nb, _end_pass_nb, _retry_sends_nb,
    _session_sends_nb, _start_pass_nb,
    _steady_decode_nb, _table_sends_nb, _transfer_ends_nb,
)


# ------------------------------------------------------------------ the kernel


@njit(cache=True)
def _routing_nb(router_policy, decode_router_policy, worker_rank_policy):
    # Whether any policy other than round robin routes (else the rows' placement stands).
    return (
        router_policy != ROUTE_ROUND_ROBIN or decode_router_policy != ROUTE_ROUND_ROBIN
        or np.any(worker_rank_policy != RANK_ROUND_ROBIN)
    )


@njit(cache=True, nogil=True)
def simulate_engine_nb(requests, load, client, topology, ranks, prefix_cache, timing, out, receipts, logs, router):
    """Simulate an aggregated or prefill/decode deployment with the ``vllm`` policy.

    Workers have global indices: the aggregated pool, or the prefill pool then
    the decode pool (SPEC §3); ranks are numbered globally, worker by worker.
    The typed parameters are the NamedTuples of ``simcore.engine.state``
    (members, dtypes and units there).

    Parameters
    ----------
    requests : Requests
        Per-request inputs (n requests).
    load : Load
        Closed or open loop, concurrency, think time, time cap (ns).
    client : Client
        Tokenizer and detokenizer servers and the detokenizer mode.
    topology : Topology
        Workers, their roles, ranks and asynchronous scheduling.
    ranks : Ranks
        Per-rank scheduler limits, KV cache, policy and prefix caching.
    prefix_cache : tuple of ndarray(int64, ndim=1)
        The prefix-cache state of ``simcore.scheduler.kv_nb`` (with the requests'
        prompt-block identities); updated.
    timing : Timing
        The pass-time model of ``simcore.timing.nb``.
    out : Outputs
        Out, ``-1`` (instants) or zero (counts) initialised: per-request
        instants (ns) and counts, per-token emission and receipt instants (ns;
        empty in the bounded output mode), and the progress counter (requests finished or rejected
        so far: the kernel releases the GIL, so another thread can read it).
    receipts : tuple of ndarray(int64, ndim=1)
        The bounded output mode's state (``simcore.receipts_nb.STREAM_FIELDS``),
        updated at every pass end instead of the per-token arrays; arrays of
        length 0 in the detailed mode.  Bounded needs ``DETOK_OFF`` or
        ``DETOK_IN_KERNEL``.
    logs : Logs
        Out: the pass log (0 rows: record nothing) with each row's rank time (ms), and on ``BAD_TIMING``
        the batch whose time was not finite and >= 0.
    router : Router
        The routing policies and their seeded draws (``simcore.engine.router_nb``).

    Returns
    -------
    status : int
        ``OK``, ``PASS_LOG_FULL`` (rerun with a larger log) or ``BAD_TIMING``.
    num_pass_rows : int
        Rows written to ``logs.pass_log``.
    num_emitted : int
        Tokens emitted.
    """
    # Round robin everywhere is the rows' placement, copied into placed_rank,
    # which the loop reads and writes as the placement (recv_rank).
    if (not _routing_nb(router.policy, router.decode_policy, router.rank_policy) and not scale_on_nb(router.scale)
            and router.fail[0] == 0):
        out.placed_rank[:] = requests.recv_rank
    state = _allocate_loop_nb(requests, load, client, topology, ranks, out, receipts, router)
    run = Run(requests, load, client, topology, ranks, prefix_cache, timing, out, receipts, logs, router)
    return _replay_nb(run, state)


@njit(cache=True)
def _latest_nb(values):
    """The largest value (-1 for none): the detokenizer servers' latest job end, the last receipt so far."""
    latest = np.int64(-1)
    for v in values:
        if v > latest:
            latest = v
    return latest


@njit(cache=True)
def _replay_nb(run, state):
    """The event loop of ``simulate_engine_nb`` (its only caller, which allocates the loop's own state).

    Parameters
    ----------
    run : Run
        ``simulate_engine_nb``'s parameters (``simcore.engine.state.Run``).
    state : LoopState
        The loop's own state: ``RequestState``, ``RankState``, ``PassState``,
        ``Loop``, ``DetokBuffers`` of ``simcore.engine.state``.

    Returns
    -------
    tuple
        As ``simulate_engine_nb``.

    Notes
    -----
    Each phase of the equal-time rule is a function of its own with one call
    site, inlined here (``inline="always"``), taking ``run`` and ``state``.
    The loop works on borrowed views of every array (``borrow_nb``, through
    the nested tuples), which the caller owns for the whole run: numba would
    otherwise count a reference to every member of every tuple at each phase
    call and member read (measured: twice the kernel time); on the views LLVM
    removes every count.
    """
    run, state = borrow_nb(run), borrow_nb(state)
    requests, load, send_ns, topology, ranks = run.requests, run.load, run.out.send_ns, run.topology, run.ranks
    prefix_cache, out, receipts = run.prefix_cache, run.out, run.receipts
    ps, lp = state.ps, state.lp
    n = requests.input_tokens.shape[0]
    num_workers = topology.worker_role.shape[0]
    num_ranks = ranks.num_blocks.shape[0]
    worker_num_ranks = topology.worker_num_ranks
    worker_async = topology.worker_async
    rank_policy = ranks.policy
    rank_prefix_caching = ranks.prefix_caching
    recv_rank = out.placed_rank
    bounded = receipts[0].shape[0] > 0
    closed_loop = load.closed_loop
    session_mode = load.session_mode
    cap_ns = load.cap_ns
    router = run.router
    scaling = scale_on_nb(router.scale)
    failing = router.fail[F_ON] != 0
    scale_log = run.logs.scale_log
    pass_end = ps.pass_end
    pass_start = ps.pass_start
    queued = ps.queued
    arr_key = lp.arr_key
    xfer_key = lp.xfer_key
    send_key = lp.send_key
    sess_key = lp.sess_key
    counts = lp.counts

    # The steady-decode shortcut (below) covers one synchronous vLLM or
    # TensorRT-LLM rank in the detailed output mode; with prefix caching, not
    # with a CPU tier (a decode pass may retry a skipped store).
    steady_path = (
        num_workers == 1 and worker_num_ranks[0] == 1 and not worker_async[0] and not bounded
        and not topology.worker_lockstep[0] and not scaling and not failing
        and rank_policy[0] != POLICY_SGLANG and not (rank_prefix_caching[0] and offload_enabled_nb(prefix_cache, 0))
    )

    if scaling and not scale_init_nb(lp.route, lp.scale, router.scale, num_workers, topology.num_decode_workers,
                                     scale_log):
        return SCALE_LOG_FULL, counts[PASS_LOG_ROWS], counts[NUM_EMITTED]
    if failing:
        fail_init_nb(lp.fail, scale_log, num_workers)

    while True:
        if steady_path:
            status = _steady_decode_nb(run, state)
            if status != OK:
                return status, counts[PASS_LOG_ROWS], counts[NUM_EMITTED]

        # Next instant: the earliest pending event.
        arr_size = counts[ARR_SIZE]
        xfer_size = counts[XFER_SIZE]
        send_size = counts[SEND_SIZE]
        sess_size = counts[SESS_SIZE]
        next_row = counts[NEXT_ROW]
        t = NO_CAP
        for w in range(num_workers):
            if pass_end[w] >= 0 and pass_end[w] < t:
                t = pass_end[w]
        if arr_size > 0 and arr_key[0] < t:
            t = arr_key[0]
        if xfer_size > 0 and xfer_key[0] < t:
            t = xfer_key[0]
        if offload_loads_pending_nb(prefix_cache):  # CPU -> GPU load ends
            t = offload_next_event_nb(prefix_cache, t)
        if closed_loop:
            if send_size > 0 and next_row < n and send_key[0] < t:
                t = send_key[0]
        elif next_row < n and send_ns[next_row] < t:
            t = send_ns[next_row]
        if session_mode:
            t = session_next_instant_nb(t, send_key, send_size, sess_key, sess_size)
        if failing and fail_retries_nb(lp.fail) > 0 and lp.retry_key[0] < t:  # the clients' retries
            t = lp.retry_key[0]
        if scaling or failing:  # their instants while another event is pending at or after them
            horizon = _latest_nb(state.dt.detok_free) if run.client.detok_mode == DETOK_IN_KERNEL else np.int64(-1)
            if scaling:
                t = scale_next_instant_nb(t, horizon, lp.scale, num_workers)
            if failing:
                t = fail_next_instant_nb(t, horizon, lp.fail, router.fail_at, num_workers)
        if t == NO_CAP or t > cap_ns:
            break
        if failing:
            fail_step_nb(t, run, state)
        if scaling and not scale_step_nb(t, lp.route, lp.scale, router.scale, router.scale_target,
                                         topology.num_decode_workers, topology.worker_first_rank, worker_num_ranks,
                                         state.rk.blocks_used, ranks.num_blocks, scale_log):
            return SCALE_LOG_FULL, counts[PASS_LOG_ROWS], counts[NUM_EMITTED]

        progressed = True
        while progressed:
            progressed = False
            # (a) pass ends, by worker index; within a pass by rank, running order.
            for w in range(num_workers):
                if pass_end[w] == t:
                    progressed = True
                    if _end_pass_nb(w, t, run, state) != OK:
                        return PASS_LOG_FULL, counts[PASS_LOG_ROWS], counts[NUM_EMITTED]
            if session_mode:  # (c) with sessions: releases, then sends, at t
                if _session_sends_nb(t, run, state):
                    progressed = True
            # (b)+(c) sends at t, in table order.
            if _table_sends_nb(t, run, state):
                progressed = True
            if failing and _retry_sends_nb(t, run, state):  # (b)+(c) the clients' retries at t, by row
                progressed = True
            # (d) engine arrivals at t, in send order; rejections end at once.
            if _arrivals_nb(t, run, state):
                progressed = True
            # (d) KV-transfer ends at t, in handoff order.
            if _transfer_ends_nb(t, run, state):
                progressed = True
            # (d) CPU -> GPU KV loads ending at t (docs/prefix-caching.md).
            if offload_loads_pending_nb(prefix_cache) and offload_loads_end_nb(prefix_cache, t, num_ranks, recv_rank):
                progressed = True

        if scaling and not scale_drained_nb(t, lp.route, lp.scale, pass_end, topology.worker_first_rank,
                                            worker_num_ranks, state.rk.inflight, scale_log):
            return SCALE_LOG_FULL, counts[PASS_LOG_ROWS], counts[NUM_EMITTED]

        # (e) idle workers with work start passes, by worker index; an
        # asynchronous worker whose pass started at t then builds the next
        # (the same worker again, before the next one).
        w = 0
        while w < num_workers:
            queue = worker_async[w] and pass_end[w] >= 0 and pass_start[w] == t and not queued[w]
            if pass_end[w] >= 0 and not queue:
                w += 1
                continue
            status = _start_pass_nb(w, t, queue, run, state)
            if status != OK:
                return status, counts[PASS_LOG_ROWS], counts[NUM_EMITTED]
            if queue or not (worker_async[w] and pass_end[w] >= 0):
                w += 1

    if failing and fail_log_full_nb(lp.fail, scale_log):
        return SCALE_LOG_FULL, counts[PASS_LOG_ROWS], counts[NUM_EMITTED]
    return OK, counts[PASS_LOG_ROWS], counts[NUM_EMITTED]


@njit(cache=True)
def _allocate_loop_nb(requests, load, client, topology, ranks, out, receipts, router):
    """The event loop's own state for one run, with the sends the load makes by itself queued.

    Returns a ``LoopState`` (``RequestState``, ``RankState``, ``PassState``,
    ``Loop``, ``DetokBuffers`` of ``simcore.engine.state``); closed loop: ``out.send_ns`` set to -1 (filled at
    each send).
    """
    send_ns = out.send_ns
    n = requests.input_tokens.shape[0]
    num_workers = topology.worker_role.shape[0]
    num_ranks = ranks.num_blocks.shape[0]
    worker_async = topology.worker_async
    detok_workers = client.detok_workers
    session_mode = load.session_mode
    max_sequences = ranks.max_sequences.max()
    max_ranks = topology.worker_num_ranks.max()
    max_outputs = max_ranks * max_sequences * (1 + ranks.spec_drafts.max())  # a verification emits 1 + accepted
    bounded = receipts[0].shape[0] > 0

    # Asynchronous scheduling: a worker's pass on the GPU and the one queued
    # behind it use sample slots run_slot[w] and 1 - run_slot[w]: per request,
    # whether its chunk in that pass samples a token; ``planned`` counts emitted
    # plus in-flight outputs (it is ``generated`` without async workers).
    any_async = False
    for w in range(num_workers):
        any_async = any_async or worker_async[w]
    any_random = False  # SGLang random: a shuffle buffer
    for g in range(num_ranks):
        any_random = any_random or ranks.queue_order[g] == ORDER_RANDOM
    request_state = RequestState(
        np.zeros(n, dtype=np.int64),  # computed
        np.zeros(n, dtype=np.int64),  # held
        np.zeros(n, dtype=np.int64),  # sched_n
        np.full(n, -1, dtype=np.int64),  # wait_next
        np.full(n, -1, dtype=np.int64),  # wait_prev
        np.zeros(n, dtype=np.int64) if any_async else out.generated,  # planned
        np.zeros((2, n if any_async else 0), dtype=np.bool_),  # sample_flag
        np.zeros(n, dtype=np.int64),  # drafts
        np.zeros(n, dtype=np.int64),  # queued_ns
        np.empty(n if any_random else 0, dtype=np.int64),  # shuffle_buf
    )
    rank_state = RankState(
        np.full(num_ranks, -1, dtype=np.int64),  # wait_head
        np.full(num_ranks, -1, dtype=np.int64),  # wait_tail
        np.empty((num_ranks, max_sequences), dtype=np.int64),  # running
        np.zeros(num_ranks, dtype=np.int64),  # run_len
        np.zeros(num_ranks, dtype=np.int64),  # blocks_used
        ranks.ratio_params[:, 0].copy(),  # ratio
        np.full(num_ranks, -1, dtype=np.int64),  # chunked
        np.zeros(num_ranks, dtype=np.bool_),  # extend
        np.zeros(num_ranks, dtype=np.int64),  # inflight
        np.zeros(num_ranks, dtype=np.int64),  # shuffles
    )
    pass_state = PassState(
        np.full(num_workers, -1, dtype=np.int64),  # pass_end
        np.full(num_workers, -1, dtype=np.int64),  # pass_start
        np.zeros((max_ranks, 8), dtype=np.int64),  # summary
        np.zeros(max_ranks, dtype=np.float64),  # rank_ms
        np.zeros(num_workers, dtype=np.int64),  # run_slot
        np.zeros(num_workers, dtype=np.bool_),  # queued
        np.zeros(num_workers, dtype=np.float64),  # queued_ms
        np.zeros((num_workers if any_async else 0, max_ranks, 8), dtype=np.int64),  # queued_summary
        np.zeros((num_workers if any_async else 0, max_ranks), dtype=np.float64),  # queued_rank_ms
    )

    # Routing (simcore.engine.router_nb): round robin everywhere is the row
    # placement, copied into placed_rank by simulate_engine_nb; any other
    # policy decides in the loop.
    scaling = scale_on_nb(router.scale)
    failing = router.fail[F_ON] != 0
    routing = _routing_nb(router.policy, router.decode_policy, router.rank_policy) or scaling or failing
    # The send heap: one entry per initial client and per request end, at most 2n.
    # Sessions: releases in the send heap, (receipt, row); rows sent through
    # their own heap, the table-order sends left idle.
    loop = Loop(
        np.empty(n, dtype=np.int64),  # arr_key
        np.empty(n, dtype=np.int64),  # arr_val
        np.empty(n, dtype=np.int64),  # xfer_key
        np.empty(n, dtype=np.int64),  # xfer_val
        np.empty(n, dtype=np.int64),  # handoff_req
        np.empty(2 * n + 1, dtype=np.int64),  # send_key
        np.zeros(2 * n + 1, dtype=np.int64),  # send_val
        np.empty(n if session_mode else 0, dtype=np.int64),  # sess_key
        np.empty(n if session_mode else 0, dtype=np.int64),  # sess_val
        np.empty(n if session_mode else 0, dtype=np.int64),  # seq_row
        np.zeros(2, dtype=np.int64),  # session_counters
        np.zeros(client.num_tok_servers, dtype=np.int64),  # tok_free
        allocate_route_nb(num_workers, num_ranks, n if routing else 0, scaling or failing),  # route
        routing,
        allocate_scale_nb(router.scale, num_workers),  # scale
        allocate_fail_nb(router.fail, router.fail_gaps, num_workers),  # fail
        np.empty(n if failing else 0, dtype=np.int64),  # retry_key
        np.empty(n if failing else 0, dtype=np.int64),  # retry_val
        np.zeros(NUM_COUNTS, dtype=np.int64),  # counts
    )
    counts = loop.counts
    if session_mode:
        counts[NEXT_ROW] = n
        counts[SESS_SIZE] = session_start_nb(
            load.session_closed, load.concurrency, load.session_first, send_ns, loop.sess_key, loop.sess_val,
            loop.session_counters,
        )
    if load.closed_loop:
        for _ in range(min(load.concurrency, n)):
            counts[SEND_SIZE] = heap_push_nb(loop.send_key, loop.send_val, counts[SEND_SIZE], 0, 0)
        for k in range(n):
            send_ns[k] = -1

    # A pass's outputs: where the detokenizer stamps each receipt (the token's
    # index, or in bounded mode the output's, into out_recv) and its request.
    out_recv = np.empty(max_outputs, dtype=np.int64)
    detok = DetokBuffers(
        np.zeros(num_workers * detok_workers, dtype=np.int64),  # detok_free
        np.empty(max_outputs, dtype=np.int64),  # out_token
        np.empty(max_outputs, dtype=np.int64),  # out_req
        out_recv,
        out_recv if bounded else out.token_recv_ns,  # recv_target
        np.empty(max_outputs, dtype=np.int64),  # out_server
        np.zeros(max_outputs, dtype=np.int64),  # out_flags
        np.zeros(detok_workers, dtype=np.int64),  # job_count
        np.zeros(detok_workers, dtype=np.int64),  # job_firsts
        np.zeros(detok_workers, dtype=np.int64),  # job_finals
        np.zeros(detok_workers, dtype=np.int64),  # job_ends
        np.empty((detok_workers, max_outputs), dtype=np.int64),  # job_tokens
        np.zeros((detok_workers, max_outputs), dtype=np.int64),  # job_flags
    )
    return LoopState(request_state, rank_state, pass_state, loop, detok)



@njit(cache=True, parallel=True)
def simulate_batch_nb(requests, load, client, topology, ranks, prefix_cache, timing, out, receipts, logs, router,
                      engine_address):
    """Run ``simulate_engine_nb`` for C independent configurations of one shape, in parallel.

    Every member of every parameter has a leading configuration axis (scalars
    become (C,) arrays, arrays gain a first dimension); configuration ``c``
    reads and writes row ``c`` (:func:`row_nb`).  "One shape": the same
    requests count ``n`` and output lengths, the same workers and ranks, one
    detokenizer mode and no pass log (``logs.pass_log`` of shape (C, 0, columns)).

    Parameters
    ----------
    requests, load, client, topology, ranks, timing, out, logs, router : NamedTuple
        As in ``simulate_engine_nb``, stacked to (C, ...) member by member
        (``timing.params`` and ``timing.table`` zero padded to the widest;
        ``out.send_ns`` (C, n)).
    prefix_cache, receipts : tuple of ndarray(int64, ndim=2)
        The ``simcore.scheduler.kv_nb`` and bounded-mode state arrays, each
        stacked to (C, length).
    engine_address : int
        Where ``simulate_engine_nb`` compiled for one row's types is (:func:`engine_address`).

    Returns
    -------
    status : ndarray(int64, ndim=2)
        (C, 3): each configuration's ``(status, num_pass_rows, num_emitted)``.
    """
    num_configs = out.send_ns.shape[0]
    status = np.empty((num_configs, 3), dtype=np.int64)
    for c in prange(num_configs):
        code, rows, emitted = call_engine_nb(engine_address, (
            row_nb(requests, c), row_nb(load, c), row_nb(client, c), row_nb(topology, c),
            row_nb(ranks, c), row_nb(prefix_cache, c), row_nb(timing, c), row_nb(out, c),
            row_nb(receipts, c), row_nb(logs, c), row_nb(router, c),
        ))
        status[c, 0] = code
        status[c, 1] = rows
        status[c, 2] = emitted
    return status


def engine_address(batch_args: tuple, engine=simulate_engine_nb) -> int:
    """The address of ``simulate_engine_nb`` compiled for one row of ``simulate_batch_nb``'s arguments.

    Compiles it (or loads it from numba's cache) for the row types first.

    Parameters
    ----------
    batch_args : tuple
        ``simulate_batch_nb``'s stacked arguments before ``engine_address``.
    engine : numba dispatcher
        ``simulate_engine_nb`` itself, bound here: ``bench/bench_capacity.py``
        replaces the module's name by a timing wrapper.

    Returns
    -------
    int
    """
    signature = tuple(batch_row_type(typeof(arg)) for arg in batch_args)
    engine.compile(signature)
    compiled = engine.overloads[signature]
    return compiled.library.get_pointer_to_function(compiled.fndesc.llvm_func_name)


@intrinsic
def call_engine_nb(typingctx, address, args):
    """``simulate_engine_nb(*args)`` through its address (:func:`engine_address` of the same types).

    A call by name links the callee's code into the caller's module, where LLVM
    optimises and compiles it again: the whole engine, twice for a ``prange``
    loop (its body is a function of its own).  Through the address the batch
    kernel compiles in seconds; the engine compiled for one configuration runs.

    Parameters
    ----------
    address : int
        Of ``simulate_engine_nb`` compiled for ``args``' types.
    args : tuple
        Its arguments.

    Returns
    -------
    tuple
        Its result.
    """
    engine_type = typingctx.resolve_value_type(simulate_engine_nb)
    result_type = typingctx.resolve_function_type(engine_type, args.types, {}).return_type

    def codegen(context, builder, signature, values):
        function_type = context.call_conv.get_function_type(result_type, args.types)
        function = builder.inttoptr(values[0], function_type.as_pointer())
        arguments = [builder.extract_value(values[1], i) for i in range(len(args.types))]
        status, result = context.call_conv.call_function(builder, function, result_type, args.types, arguments)
        with cgutils.if_unlikely(builder, status.is_error):
            context.call_conv.return_status_propagate(builder, status)
        return result

    return result_type(address, args), codegen


def batch_row_type(batch_type):
    """The numba type of one configuration's row of a batch member (an array) or state (a tuple of them).

    An array of shape (C,) gives its dtype, one of shape (C, ...) an array of one
    dimension less (C-contiguous if it is, as numba types ``array[c]``); a tuple
    or NamedTuple gives the tuple of its members' rows, built as numba's
    ``typeof`` builds the single-configuration state's type (a NamedTuple whose
    members share one type is a ``NamedUniTuple``): another type for the same
    state would compile a second ``simulate_engine_nb``, the whole engine again.

    Parameters
    ----------
    batch_type : numba.types.Array or numba.types.BaseTuple
        With a leading configuration axis.

    Returns
    -------
    numba.types.Type
    """
    if isinstance(batch_type, types.Array):
        if batch_type.ndim == 1:
            return batch_type.dtype
        return types.Array(batch_type.dtype, batch_type.ndim - 1, "C" if batch_type.layout == "C" else "A")
    members = [batch_row_type(member) for member in batch_type.types]
    return types.BaseTuple.from_types(members, getattr(batch_type, "instance_class", tuple))


@intrinsic
def row_nb(typingctx, state, c):
    """Row ``c`` of every array in a tuple (or NamedTuple), nested tuples included: the batch's per-configuration view.

    A member of shape (C,) gives its scalar, one of shape (C, ...) a view of its
    row, a tuple member the tuple of its members' rows; the result's type is
    :func:`batch_row_type`'s, the single-configuration state's.

    Parameters
    ----------
    state : tuple or NamedTuple of ndarray (or of such tuples)
        Members with a leading configuration axis.
    c : int
        Configuration.

    Returns
    -------
    tuple or NamedTuple
        Row ``c`` of each member.
    """
    row_type = batch_row_type(state)

    def row(context, builder, typ, value, index):
        if isinstance(typ, types.BaseTuple):
            rows = [row(context, builder, member, builder.extract_value(value, m), index)
                    for m, member in enumerate(typ.types)]
            return context.make_tuple(builder, batch_row_type(typ), rows)
        return context.compile_internal(builder, lambda array, i: array[i], batch_row_type(typ)(typ, c), (value, index))

    def codegen(context, builder, signature, args):
        value, index = args
        return row(context, builder, state, value, index)

    return row_type(state, c), codegen


@intrinsic
def borrow_nb(typingctx, state):
    """A borrowed view of an array, or of every array in a tuple (or NamedTuple), nested: no reference count.

    The view's data, shape and strides are the array's; its memory-info
    pointer is null, so numba's reference-count updates on it (at every
    copy of a tuple into an inlined function, every member read, every call)
    are no-ops, which LLVM removes where the view is built in the same
    function.  The caller must keep the arrays alive while the views are used
    and let no view outlive them (the event loop: its state lives in
    ``simulate_engine_nb``'s frame for the whole run).

    Parameters
    ----------
    state : ndarray, or tuple or NamedTuple of ndarray, scalars and such tuples (borrowed throughout)

    Returns
    -------
    the same type as ``state``
    """

    def borrowed(context, builder, typ, value):
        if isinstance(typ, types.BaseTuple):  # nested tuples: every array inside
            members = [borrowed(context, builder, member, builder.extract_value(value, m))
                       for m, member in enumerate(typ.types)]
            return context.make_tuple(builder, typ, members)
        if not isinstance(typ, types.Array):
            return value
        array = context.make_array(typ)(context, builder, value=value)
        array.meminfo = cgutils.get_null_value(array.meminfo.type)
        return array._getvalue()

    def codegen(context, builder, signature, args):
        (value,) = args
        return borrowed(context, builder, state, value)

    return state(state), codegen


