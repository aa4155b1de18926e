"""Engine replay kernel: the discrete-event loop over engine passes (SPEC §2-7, 9).

Contract
--------
* Every function is ``@njit(cache=True)``; arguments are contiguous numpy
  arrays, scalars and the NamedTuples of ``simcore.engine.state`` (typed
  state, declared once), never Python objects.  The entry points take the
  typed state; the event loop (``_replay_nb``) takes its members.  Requests
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
  (per-server FIFO evaluated at every pass end; the default, and the only one
  a closed loop, where receipts release sends, can use) or ``DETOK_DEFERRED``
  (emission order is logged and ``simcore.client.api.receipts_after_run``
  computes receipts afterwards).

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
from numba import njit, prange, types
from numba.extending import intrinsic

from simcore.receipts_nb import stream_receipts_nb
from simcore.scheduler.kv_nb import kv_register_nb, kv_release_nb
from simcore.scheduler.radix_nb import radix_insert_nb, radix_release_nb
from simcore.scheduler.offload_nb import offload_loads_end_nb, offload_loads_pending_nb, offload_next_event_nb
from simcore.scheduler.nb import (
    POLICY_SGLANG,
    batch_summary_nb,
    POLICY_TRTLLM,
    build_sglang_batch_nb,
    reset_ratio_if_idle_nb,
    build_vllm_batch_nb,
    wait_push_back_nb,
)
from simcore.client.nb import detokenization_service_ns_nb, detokenize_pass_nb
from simcore.heap_nb import heap_pop_nb, heap_push_nb
from simcore.engine.sessions_nb import (
    session_finals_nb, session_next_instant_nb, session_next_send_nb, session_releases_nb, session_start_nb,
)
from simcore.enums import (  # noqa: F401  shared with the client and metrics stages
    DETOK_OFF, DETOK_IN_KERNEL, DETOK_DEFERRED, OUT_FIRST, OUT_FINAL,
    ROLE_AGGREGATED, ROLE_PREFILL, ROLE_DECODE, PASS_WORKER, PASS_RANK, PASS_START, PASS_END,
    PASS_NUM_PREFILL, PASS_PREFILL_TOKENS, PASS_PREFILL_KV_TOKENS, PASS_NUM_DECODE,
    PASS_DECODE_KV_TOKENS, PASS_BLOCKS_IN_USE, PASS_LOG_COLUMNS,
)
from simcore.timing.nb import rank_time_ms_nb
from simcore.enums import RANK_ROUND_ROBIN, ROUTE_ROUND_ROBIN
from simcore.engine.router_nb import (
    allocate_route_nb, handoff_rank_nb, route_arrival_nb, route_handoff_nb, route_leave_nb, route_prompt_done_nb,
    route_send_nb,
)

OK = 0
PASS_LOG_FULL = 1
BAD_TIMING = 2

NO_CAP = np.iinfo(np.int64).max



# ------------------------------------------------------------------ the kernel


@njit(cache=True)
def _decode_rank_nb(h, first_decode_worker, num_decode_workers, worker_first_rank, worker_num_ranks):
    """Global decode rank of handoff h: worker h mod Wd, rank (h div Wd) mod Rd (SPEC §3)."""
    w = first_decode_worker + h % num_decode_workers
    return worker_first_rank[w] + (h // num_decode_workers) % worker_num_ranks[w]


@njit(cache=True)
def _routing_nb(router_policy, decode_router_policy, worker_rank_policy):
    # Whether any policy other than round robin routes (else the rows' placement stands).
    return (
        router_policy != ROUTE_ROUND_ROBIN or decode_router_policy != ROUTE_ROUND_ROBIN
        or np.any(worker_rank_policy != RANK_ROUND_ROBIN)
    )


@njit(cache=True)
def _has_work_nb(first_rank, num_ranks, run_len, wait_head):
    """Whether any rank of a worker has a running or waiting request."""
    for g in range(first_rank, first_rank + num_ranks):
        if run_len[g] > 0 or wait_head[g] >= 0:
            return True
    return False


@njit(cache=True, nogil=True)
def simulate_engine_nb(requests, load, client, send_ns, topology, ranks, prefix_cache, timing, out, receipts, logs,
                       router):
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
    send_ns : ndarray(int64, ndim=1)
        Send instants, ns.  Open loop: given, non-decreasing.  Closed loop:
        filled in (``-1`` stays for rows never sent).
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
        receipts left at -1 in ``DETOK_DEFERRED`` mode; empty in the bounded
        output mode), and the progress counter (requests finished or rejected
        so far: the kernel releases the GIL, so another thread can read it).
    receipts : tuple of ndarray(int64, ndim=1)
        The bounded output mode's state (``simcore.receipts_nb.STREAM_FIELDS``),
        updated at every pass end instead of the per-token arrays; arrays of
        length 0 in the detailed mode.  Bounded needs ``DETOK_OFF`` or
        ``DETOK_IN_KERNEL``.
    logs : Logs
        Out: the emission log (``DETOK_DEFERRED`` only), the pass log (0 rows:
        record nothing) with each row's rank time (ms), and on ``BAD_TIMING``
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
        Tokens emitted (rows written to ``logs.emit_log`` in deferred mode).
    """
    # The loop reads and writes the placement as its parameter recv_rank:
    # rebinding that name to placed_rank inside it measured ~3% slower (bench_trace reference).
    if not _routing_nb(router.policy, router.decode_policy, router.rank_policy):
        out.placed_rank[:] = requests.recv_rank
    return _replay_nb(
        requests.input_tokens, requests.output_tokens, requests.token_offset, send_ns, load.closed_loop,
        load.concurrency, load.think_ns, out.placed_rank, client.tok_server, client.tok_service_ns,
        client.num_tok_servers, requests.transfer_ns, client.detok_mode, client.detok_server, client.detok_workers,
        client.detok_params, client.chunk_size, topology.worker_role, topology.worker_first_rank,
        topology.worker_num_ranks, topology.num_decode_workers, topology.worker_async, ranks.max_batched_tokens,
        ranks.max_sequences, ranks.num_blocks, ranks.block_size, ranks.seq_limit, ranks.policy, ranks.chunk_tokens,
        ranks.max_prefill_tokens, ranks.ratio_params, ranks.prefix_caching, prefix_cache, timing.model,
        timing.params, timing.table, load.cap_ns, out.arrival_ns, out.first_admit_ns, out.first_emit_ns,
        out.finish_ns, out.reject_ns, out.handoff_ns, out.transfer_end_ns, out.decode_rank, out.cached_tokens,
        out.generated, out.num_preemptions, out.token_emit_ns, out.token_recv_ns, receipts, logs.emit_log,
        logs.pass_log, logs.pass_ms, logs.bad_batch, out.progress, router.policy, router.decode_policy,
        router.rank_policy, router.weights, router.draws, router.decode_draws, router.tok_index, router.tok_workers,
        out.placed_rank, out.placed_worker,
        load.session_mode, load.session_closed, load.session_think_ns, load.session_first, load.next_turn,
        load.turn_think_ns, load.seq_rank, load.seq_tok_base, out.send_seq, ranks.reserve_full_isl,
    )


@njit(cache=True)
def _replay_nb(
    input_tokens,
    output_tokens,
    token_offset,
    send_ns,
    closed_loop,
    concurrency,
    think_ns,
    recv_rank,
    tok_server,
    tok_service_ns,
    num_tok_servers,
    transfer_ns,
    detok_mode,
    detok_server,
    detok_workers,
    detok_params,
    chunk_size,
    worker_role,
    worker_first_rank,
    worker_num_ranks,
    num_decode_workers,
    worker_async,
    rank_max_batched_tokens,
    rank_max_sequences,
    rank_num_blocks,
    rank_block_size,
    rank_seq_limit,
    rank_policy,
    rank_chunk_tokens,
    rank_max_prefill_tokens,
    ratio_params,
    rank_prefix_caching,
    prefix_cache,
    timing_model,
    timing_params,
    timing_table,
    cap_ns,
    arrival_ns,
    first_admit_ns,
    first_emit_ns,
    finish_ns,
    reject_ns,
    handoff_ns,
    transfer_end_ns,
    decode_rank,
    cached_tokens,
    generated,
    num_preemptions,
    token_emit_ns,
    token_recv_ns,
    receipts,
    emit_log,
    pass_log,
    pass_ms,
    bad_batch,
    progress,
    router_policy,
    decode_router_policy,
    worker_rank_policy,
    router_weights,
    route_draws,
    decode_draws,
    tok_index,
    tok_workers,
    placed_rank,
    placed_worker,
    session_mode,
    session_closed,
    session_think_ns,
    session_first,
    next_turn,
    turn_think_ns,
    seq_rank,
    seq_tok_base,
    send_seq,
    rank_reserve_full_isl,
):
    """The event loop of ``simulate_engine_nb``, over the members of its typed state.

    The parameters are the members of ``simcore.engine.state``'s tuples,
    unpacked once per run by ``simulate_engine_nb`` (the only caller): the
    loop reads arrays that are its own parameters, which numba compiles to
    faster code than the same arrays taken out of tuple parameters (measured
    on bench/bench_kernel.py: 8-12% of kernel time).  Returns as
    ``simulate_engine_nb``.
    """
    n = input_tokens.shape[0]
    num_workers = worker_role.shape[0]
    num_ranks = rank_num_blocks.shape[0]
    first_decode_worker = num_workers - num_decode_workers
    record_passes = pass_log.shape[0] > 0
    bounded = receipts[0].shape[0] > 0
    pass_log_rows = 0
    num_emitted = 0
    num_handoffs = 0

    # Per-request engine state.
    computed = np.zeros(n, dtype=np.int64)
    held = np.zeros(n, dtype=np.int64)
    sched_n = np.zeros(n, dtype=np.int64)
    wait_next = np.full(n, -1, dtype=np.int64)
    wait_prev = np.full(n, -1, dtype=np.int64)

    # Per-rank state.
    wait_head = np.full(num_ranks, -1, dtype=np.int64)
    wait_tail = np.full(num_ranks, -1, dtype=np.int64)
    running = np.empty((num_ranks, rank_max_sequences.max()), dtype=np.int64)
    run_len = np.zeros(num_ranks, dtype=np.int64)
    blocks_used = np.zeros(num_ranks, dtype=np.int64)
    rank_ratio = ratio_params[:, 0].copy()  # SGLang new_token_ratio
    rank_chunked = np.full(num_ranks, -1, dtype=np.int64)  # SGLang chunked request
    rank_extend = np.zeros(num_ranks, dtype=np.bool_)  # SGLang: the batch is an extend batch
    rank_inflight = np.zeros(num_ranks, dtype=np.int64)  # KV transfers from or to the rank

    # Per-worker state and the batch summary of the pass being started.
    pass_end = np.full(num_workers, -1, dtype=np.int64)
    pass_start = np.full(num_workers, -1, dtype=np.int64)
    max_ranks = worker_num_ranks.max()
    summary = np.zeros((max_ranks, 7), dtype=np.int64)  # SPEC §8, blocks in use, longest decode
    rank_ms = np.zeros(max_ranks, dtype=np.float64)

    # Asynchronous scheduling: a worker's pass on the GPU and the one queued
    # behind it use sample slots run_slot[w] and 1 - run_slot[w]: per request,
    # whether its chunk in that pass samples a token; ``planned`` counts emitted
    # plus in-flight outputs (it is ``generated`` without async workers).
    any_async = False
    for w in range(num_workers):
        any_async = any_async or worker_async[w]
    sample_flag = np.zeros((2, n if any_async else 0), dtype=np.bool_)
    run_slot = np.zeros(num_workers, dtype=np.int64)
    queued = np.zeros(num_workers, dtype=np.bool_)
    queued_ms = np.zeros(num_workers, dtype=np.float64)
    queued_summary = np.zeros((num_workers if any_async else 0, max_ranks, 7), dtype=np.int64)
    queued_rank_ms = np.zeros((num_workers if any_async else 0, max_ranks), dtype=np.float64)
    planned = np.zeros(n, dtype=np.int64) if any_async else generated

    # Servers and the outputs of the pass being ended.
    tok_free = np.zeros(num_tok_servers, dtype=np.int64)
    detok_free = np.zeros(num_workers * detok_workers, dtype=np.int64)
    max_outputs = max_ranks * rank_max_sequences.max()
    # A pass's outputs: where the detokenizer stamps each receipt (the token's
    # index, or in bounded mode the output's, into out_recv) and its request.
    out_token = np.empty(max_outputs, dtype=np.int64)
    out_req = np.empty(max_outputs, dtype=np.int64)
    out_recv = np.empty(max_outputs, dtype=np.int64)
    recv_target = out_recv if bounded else token_recv_ns
    out_server = np.empty(max_outputs, dtype=np.int64)
    out_flags = np.zeros(max_outputs, dtype=np.int64)
    job_count = np.zeros(detok_workers, dtype=np.int64)  # outputs in each server's job
    job_firsts = np.zeros(detok_workers, dtype=np.int64)  # of which request-first tokens
    job_finals = np.zeros(detok_workers, dtype=np.int64)  # of which request-final tokens
    job_ends = np.zeros(detok_workers, dtype=np.int64)
    job_tokens = np.empty((detok_workers, max_outputs), dtype=np.int64)
    job_flags = np.zeros((detok_workers, max_outputs), dtype=np.int64)

    # Routing (simcore.engine.router_nb): round robin everywhere is the row
    # placement, copied into placed_rank (passed as recv_rank) by
    # simulate_engine_nb; any other policy decides in the loop.
    routing = _routing_nb(router_policy, decode_router_policy, worker_rank_policy)
    route = allocate_route_nb(num_workers, num_ranks, n if routing else 0)

    # Event queues: engine arrivals by (instant, k); KV-transfer ends by
    # (instant, handoff number); closed-loop sends by instant.
    arr_key = np.empty(n, dtype=np.int64)
    arr_val = np.empty(n, dtype=np.int64)
    arr_size = 0
    xfer_key = np.empty(n, dtype=np.int64)
    xfer_val = np.empty(n, dtype=np.int64)
    xfer_size = 0
    handoff_req = np.empty(n, dtype=np.int64)
    # One entry per initial client and per request end: at most 2n.
    send_key = np.empty(2 * n + 1, dtype=np.int64)
    send_val = np.zeros(2 * n + 1, dtype=np.int64)
    send_size = 0
    next_row = 0  # next row to send (both loops send rows in table order)

    # Sessions (simcore.engine.sessions_nb): releases in the send heap, (receipt, row);
    # rows sent through their own heap, the table-order loops below left idle.
    sess_key = np.empty(n if session_mode else 0, dtype=np.int64)
    sess_val = np.empty(n if session_mode else 0, dtype=np.int64)
    seq_row = np.empty(n if session_mode else 0, dtype=np.int64)
    session_counters = np.zeros(2, dtype=np.int64)
    sess_size = 0
    if session_mode:
        next_row = n
        sess_size = session_start_nb(
            session_closed, concurrency, session_first, send_ns, sess_key, sess_val, session_counters
        )

    if closed_loop:
        for _ in range(min(concurrency, n)):
            send_size = heap_push_nb(send_key, send_val, send_size, 0, 0)
        for k in range(n):
            send_ns[k] = -1

    # The steady-decode shortcut (below) covers one synchronous vLLM or
    # TensorRT-LLM rank without prefix caching, in the detailed output mode.
    steady_path = (
        num_workers == 1 and worker_num_ranks[0] == 1 and not worker_async[0] and not bounded
        and rank_policy[0] != POLICY_SGLANG and not rank_prefix_caching[0]
    )
    steady_budget = rank_max_batched_tokens[0]
    steady_block_size = rank_block_size[0]
    steady_seq_limit = rank_seq_limit[0]

    while True:
        # Steady decode: while worker 0's running pass ends before every other
        # event and by the cap, every running request decodes one token in it
        # (none its first), none finishes or reaches the sequence limit there,
        # and each one's next token fits its held blocks and the token budget,
        # the general loop would end that pass and build the same batch again
        # (no event, admission, preemption or new block): do just that here,
        # inline (a helper call with this many arrays costs more than a pass).
        while steady_path and pass_end[0] >= 0 and wait_head[0] < 0 and run_len[0] <= steady_budget:
            t = pass_end[0]
            if t > cap_ns or arr_size > 0 and arr_key[0] <= t:
                break
            if closed_loop:
                if send_size > 0 and next_row < n and send_key[0] <= t:
                    break
            elif next_row < n and send_ns[next_row] <= t:
                break
            if session_mode and session_next_instant_nb(t + 1, send_key, send_size, sess_key, sess_size) <= t:
                break
            steady = True
            for i in range(run_len[0]):
                k = running[0, i]
                j = generated[k]
                if not (
                    sched_n[k] == 1 and j >= 1 and computed[k] == input_tokens[k] + j - 1
                    and j + 1 < output_tokens[k] and input_tokens[k] + j + 1 < steady_seq_limit
                    and computed[k] + 2 <= held[k] * steady_block_size
                ):
                    steady = False
                    break
            if not steady:
                break
            # (a) the pass end: each emits its next token; (e) the next pass
            # schedules each one token again (sched_n stays 1) and its summary
            # is the decode rule of batch_summary_nb.
            num_out = 0
            decode_kv_tokens = 0
            decode_kv_max = 0
            for i in range(run_len[0]):
                k = running[0, i]
                computed[k] += 1
                decode_kv_tokens += computed[k] + 1
                decode_kv_max = max(decode_kv_max, computed[k] + 1)
                j = generated[k]
                generated[k] = j + 1
                tok = token_offset[k] + j
                token_emit_ns[tok] = t
                if detok_mode == DETOK_OFF:
                    token_recv_ns[tok] = t
                elif detok_mode == DETOK_IN_KERNEL:
                    srv = detok_server[k]
                    out_token[num_out] = tok
                    out_server[num_out] = srv
                    out_flags[num_out] = 0
                    num_out += 1
                    job_count[srv] += 1
                else:
                    emit_log[num_emitted] = tok
                num_emitted += 1
            if num_out > 0 and chunk_size == 0:
                # One job per server, none with a first or final token (as in
                # detokenize_pass_nb, inline: its call costs ~0.4 µs of array arguments).
                for s in range(detok_workers):
                    if job_count[s] > 0:
                        job_ends[s] = max(t, detok_free[s]) + detokenization_service_ns_nb(detok_params, job_count[s], 0, 0)
                        detok_free[s] = job_ends[s]
                        job_count[s] = 0
                for e in range(num_out):
                    token_recv_ns[out_token[e]] = job_ends[out_server[e]]
            elif num_out > 0:  # no request-final token among them: no send is queued
                send_size = detokenize_pass_nb(
                    t, 0, num_out, out_token, out_server, out_flags, chunk_size, detok_params,
                    detok_free, recv_target, job_count, job_firsts, job_finals, job_ends,
                    job_tokens, job_flags, closed_loop, think_ns, send_key, send_val, send_size,
                )
            summary[0, 0] = 0
            summary[0, 1] = 0
            summary[0, 2] = 0
            summary[0, 3] = run_len[0]
            summary[0, 4] = decode_kv_tokens
            summary[0, 6] = decode_kv_max
            ms = rank_time_ms_nb(
                timing_model, timing_params, timing_table, 0, 0, 0, run_len[0], decode_kv_tokens, decode_kv_max
            )
            if not (ms >= 0.0 and ms < np.inf):
                _report_bad_batch_nb(bad_batch, 0, 0, summary, ms)
                return BAD_TIMING, pass_log_rows, num_emitted
            rank_ms[0] = ms
            summary[0, 5] = blocks_used[0]
            end = t + max(np.int64(1), np.int64(np.rint(ms * 1e6)))
            pass_end[0] = end
            pass_start[0] = t
            if record_passes:
                if pass_log_rows + 1 > pass_log.shape[0]:
                    return PASS_LOG_FULL, pass_log_rows, num_emitted
                pass_log_rows = _log_pass_nb(pass_log, pass_ms, pass_log_rows, 0, 1, t, end, summary, rank_ms)

        # Next instant: the earliest pending event.
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
        if t == NO_CAP or t > cap_ns:
            break

        progressed = True
        while progressed:
            progressed = False
            # (a) pass ends, by worker index; within a pass by rank, running order.
            for w in range(num_workers):
                if pass_end[w] != t:
                    continue
                pass_end[w] = -1
                progressed = True
                hidden = worker_role[w] == ROLE_PREFILL
                asynchronous = worker_async[w]
                slot = run_slot[w]
                num_out = 0
                for g in range(worker_first_rank[w], worker_first_rank[w] + worker_num_ranks[w]):
                    keep = 0
                    for i in range(run_len[g]):
                        k = running[g, i]
                        leaves = False
                        samples = False
                        if sched_n[k] > 0:  # synchronous: the pass's tokens are computed now
                            computed[k] += sched_n[k]
                            sched_n[k] = 0
                            samples = computed[k] == input_tokens[k] + generated[k]
                            if samples and rank_policy[g] == POLICY_SGLANG and rank_prefix_caching[g] and (
                                rank_extend[g] or generated[k] + 1 == output_tokens[k]
                                or input_tokens[k] + generated[k] + 1 >= rank_seq_limit[g]
                            ):
                                # SGLang inserts a prompt once computed and a request as it finishes.
                                radix_insert_nb(prefix_cache, g, rank_num_blocks.shape[0], k, computed[k],
                                                rank_block_size[g], blocks_used)
                        elif asynchronous:  # computed advanced when the pass was built
                            samples = sample_flag[slot, k]
                            sample_flag[slot, k] = False
                        if samples:
                            if hidden:
                                # Prompt computed: hand off; the sampled token
                                # is not sent and the blocks stay held until
                                # the transfer ends (SPEC §6).
                                leaves = True
                                handoff_ns[k] = t
                                handoff_req[num_handoffs] = k
                                xfer_size = heap_push_nb(
                                    xfer_key, xfer_val, xfer_size, t + transfer_ns[k], num_handoffs
                                )
                                rank_inflight[g] += 1
                                if routing:
                                    route_prompt_done_nb(route, k, input_tokens[k])
                                    route_leave_nb(route, k, g)
                                    to_rank = route_handoff_nb(
                                        route, num_handoffs, k, decode_router_policy, worker_rank_policy,
                                        first_decode_worker, num_decode_workers, decode_draws, router_weights,
                                        input_tokens[k], worker_first_rank, worker_num_ranks, run_len,
                                        blocks_used, rank_num_blocks, rank_block_size, prefix_cache,
                                    )
                                else:
                                    to_rank = _decode_rank_nb(
                                        num_handoffs, first_decode_worker, num_decode_workers,
                                        worker_first_rank, worker_num_ranks,
                                    )
                                rank_inflight[to_rank] += 1
                                num_handoffs += 1
                            else:
                                j = generated[k]
                                generated[k] = j + 1
                                tok = token_offset[k] + j
                                if j == 0:
                                    first_emit_ns[k] = t
                                    if routing:
                                        route_prompt_done_nb(route, k, input_tokens[k])
                                leaves = (
                                    j + 1 == output_tokens[k]
                                    or input_tokens[k] + j + 1 >= rank_seq_limit[g]
                                )
                                out_req[num_out] = k
                                if bounded:
                                    tok = num_out
                                else:
                                    token_emit_ns[tok] = t
                                if detok_mode == DETOK_OFF:
                                    recv_target[tok] = t  # received as emitted
                                    num_out += bounded  # bounded: streamed at the pass end
                                    if leaves and closed_loop:
                                        send_size = heap_push_nb(
                                            send_key, send_val, send_size, t + think_ns, 0
                                        )
                                    if leaves and session_mode:  # ends at the client now
                                        send_size = heap_push_nb(send_key, send_val, send_size, t, k)
                                elif detok_mode == DETOK_IN_KERNEL:
                                    srv = detok_server[k]
                                    out_token[num_out] = tok
                                    out_server[num_out] = srv
                                    out_flags[num_out] = (j == 0) * OUT_FIRST + leaves * OUT_FINAL
                                    num_out += 1
                                    # The server's job so far (one job per server
                                    # per pass unless chunked).
                                    job_count[srv] += 1
                                    job_firsts[srv] += j == 0
                                    job_finals[srv] += leaves
                                else:
                                    emit_log[num_emitted] = tok
                                num_emitted += 1
                                if leaves:
                                    finish_ns[k] = t
                                    progress[0] += 1
                                    if routing:
                                        route_leave_nb(route, k, g)
                                    if rank_policy[g] == POLICY_TRTLLM and rank_prefix_caching[g]:
                                        # storeBlocksForReuse: prompt + output - 1 tokens.
                                        kv_register_nb(prefix_cache, g, rank_num_blocks.shape[0], k, computed[k],
                                                       rank_block_size[g])
                                    if rank_policy[g] == POLICY_SGLANG:  # unlocks its radix-tree path
                                        radix_release_nb(prefix_cache, g, k, held, blocks_used)
                                    else:
                                        kv_release_nb(prefix_cache, g, k, held, blocks_used)
                        if not leaves:
                            running[g, keep] = k
                            keep += 1
                    run_len[g] = keep
                if not _has_work_nb(worker_first_rank[w], worker_num_ranks[w], run_len, wait_head):
                    reset_ratio_if_idle_nb(
                        worker_first_rank[w], worker_num_ranks[w], worker_role[w] == ROLE_DECODE,
                        wait_head, rank_inflight, rank_ratio, ratio_params,
                    )

                # (b) this pass's detokenizer jobs: per server, in server order,
                # the server's outputs in rank then running order, cut in chunks.
                if detok_mode == DETOK_IN_KERNEL and num_out > 0:
                    send_size = detokenize_pass_nb(
                        t, w * detok_workers, num_out, out_token, out_server, out_flags, chunk_size, detok_params,
                        detok_free, recv_target, job_count, job_firsts, job_finals, job_ends, job_tokens,
                        job_flags, closed_loop, think_ns, send_key, send_val, send_size,
                    )
                if session_mode and detok_mode == DETOK_IN_KERNEL and num_out > 0:
                    send_size = session_finals_nb(
                        num_out, out_req, out_token, out_flags, recv_target, send_key, send_val, send_size
                    )
                if bounded and num_out > 0:
                    stream_receipts_nb(num_out, out_req, out_recv, cap_ns, receipts)
                if queued[w]:  # asynchronous: the pass built at this one's start runs now
                    queued[w] = False
                    run_slot[w] = 1 - slot
                    pass_start[w] = t
                    pass_end[w] = t + max(np.int64(1), np.int64(np.rint(queued_ms[w] * 1e6)))
                    if record_passes:
                        if pass_log_rows + worker_num_ranks[w] > pass_log.shape[0]:
                            return PASS_LOG_FULL, pass_log_rows, num_emitted
                        pass_log_rows = _log_pass_nb(
                            pass_log, pass_ms, pass_log_rows, w, worker_num_ranks[w], t, pass_end[w],
                            queued_summary[w], queued_rank_ms[w],
                        )

            if session_mode:  # (c) with sessions: releases, then sends, at t
                send_size, sess_size, released = session_releases_nb(
                    t, session_closed, session_think_ns, next_turn, turn_think_ns, session_first, send_key,
                    send_val, send_size, sess_key, sess_val, sess_size, session_counters,
                )
                progressed = progressed or released
                while True:
                    sess_size, k, s = session_next_send_nb(
                        t, sess_key, sess_val, sess_size, session_counters, send_ns, send_seq, seq_row
                    )
                    if k < 0:
                        break
                    progressed = True
                    if routing:  # the router picks the worker of send s
                        w = route_send_nb(
                            route, s, k, router_policy, worker_rank_policy, 0, first_decode_worker, route_draws,
                            router_weights, input_tokens, worker_first_rank, worker_num_ranks, run_len,
                            blocks_used, rank_num_blocks, rank_block_size, prefix_cache, placed_rank,
                        )
                        placed_worker[k] = w
                        server = w * tok_workers + tok_index[k]
                    else:  # the placement of send sequence number s (SPEC §3)
                        recv_rank[k] = seq_rank[s]
                        server = seq_tok_base[s] + tok_server[k]
                    end = max(t, tok_free[server]) + tok_service_ns[k]
                    tok_free[server] = end
                    arr_size = heap_push_nb(arr_key, arr_val, arr_size, end, s)

            # (b)+(c) sends at t, in table order.
            while next_row < n:
                if closed_loop:
                    if send_size == 0 or send_key[0] != t:
                        break
                    send_size = heap_pop_nb(send_key, send_val, send_size)
                    send_ns[next_row] = t
                elif send_ns[next_row] != t:
                    break
                k = next_row
                next_row += 1
                progressed = True
                if routing:  # the router picks the worker, whose tokenizer takes the request
                    w = route_send_nb(
                        route, k, k, router_policy, worker_rank_policy, 0, first_decode_worker, route_draws,
                        router_weights, input_tokens, worker_first_rank, worker_num_ranks, run_len, blocks_used,
                        rank_num_blocks, rank_block_size, prefix_cache, placed_rank,
                    )
                    placed_worker[k] = w
                    server = w * tok_workers + tok_index[k]
                else:
                    server = tok_server[k]
                # (d) tokenizer job, FIFO per server in send order.
                end = max(t, tok_free[server]) + tok_service_ns[k]
                tok_free[server] = end
                arr_size = heap_push_nb(arr_key, arr_val, arr_size, end, k)

            # (d) engine arrivals at t, in send order; rejections end at once.
            while arr_size > 0 and arr_key[0] == t:
                k = arr_val[0]
                if session_mode:  # keyed by send sequence number
                    k = seq_row[k]
                arr_size = heap_pop_nb(arr_key, arr_val, arr_size)
                progressed = True
                arrival_ns[k] = t
                if routing:
                    route_arrival_nb(route, k, worker_first_rank, worker_num_ranks, run_len, blocks_used,
                                     rank_num_blocks, recv_rank)
                send_size = _enter_rank_nb(
                    k, recv_rank[k], t, input_tokens, rank_seq_limit, reject_ns, closed_loop,
                    think_ns, send_key, send_val, send_size, wait_head, wait_tail, wait_next, wait_prev,
                    progress,
                )
                if routing and reject_ns[k] >= 0:
                    route_prompt_done_nb(route, k, input_tokens[k])
                    route_leave_nb(route, k, recv_rank[k])
                if session_mode and reject_ns[k] == t:  # the rejection ends at the client now
                    send_size = heap_push_nb(send_key, send_val, send_size, t, k)

            # (d) KV-transfer ends at t, in handoff order: free the prefill
            # blocks and enter the decode rank (h mod Wd, (h div Wd) mod Rd, or
            # the one routed at the handoff).
            while xfer_size > 0 and xfer_key[0] == t:
                h = xfer_val[0]
                xfer_size = heap_pop_nb(xfer_key, xfer_val, xfer_size)
                progressed = True
                k = handoff_req[h]
                if rank_policy[recv_rank[k]] == POLICY_SGLANG and rank_prefix_caching[recv_rank[k]]:
                    radix_insert_nb(prefix_cache, recv_rank[k], rank_num_blocks.shape[0], k, input_tokens[k],
                                    rank_block_size[recv_rank[k]], blocks_used)  # cache_finished_req
                if rank_policy[recv_rank[k]] == POLICY_TRTLLM and rank_prefix_caching[recv_rank[k]]:
                    kv_register_nb(prefix_cache, recv_rank[k], rank_num_blocks.shape[0], k, input_tokens[k],
                                   rank_block_size[recv_rank[k]])  # storeBlocksForReuse
                if rank_policy[recv_rank[k]] == POLICY_SGLANG:
                    radix_release_nb(prefix_cache, recv_rank[k], k, held, blocks_used)
                else:
                    kv_release_nb(prefix_cache, recv_rank[k], k, held, blocks_used)
                transfer_end_ns[k] = t
                if routing:
                    g = handoff_rank_nb(route, h)
                else:
                    g = _decode_rank_nb(h, first_decode_worker, num_decode_workers, worker_first_rank, worker_num_ranks)
                rank_inflight[recv_rank[k]] -= 1
                rank_inflight[g] -= 1
                decode_rank[k] = g
                computed[k] = input_tokens[k] - 1
                send_size = _enter_rank_nb(
                    k, g, t, input_tokens, rank_seq_limit, reject_ns, closed_loop,
                    think_ns, send_key, send_val, send_size, wait_head, wait_tail, wait_next, wait_prev,
                    progress,
                )
                if routing and reject_ns[k] >= 0:
                    route_prompt_done_nb(route, k, input_tokens[k])
                    route_leave_nb(route, k, g)
                if session_mode and reject_ns[k] == t:
                    send_size = heap_push_nb(send_key, send_val, send_size, t, k)

            # (d) CPU -> GPU KV loads ending at t (docs/prefix-caching.md).
            if offload_loads_pending_nb(prefix_cache) and offload_loads_end_nb(prefix_cache, t, num_ranks, recv_rank):
                progressed = True

        # (e) idle workers with work start passes, by worker index; an
        # asynchronous worker whose pass started at t then builds the next
        # (the same worker again, before the next one).
        w = 0
        while w < num_workers:
            queue = worker_async[w] and pass_end[w] >= 0 and pass_start[w] == t and not queued[w]
            if pass_end[w] >= 0 and not queue:
                w += 1
                continue
            first_rank = worker_first_rank[w]
            num_dp = worker_num_ranks[w]
            slot = 1 - run_slot[w] if queue else run_slot[w]
            while True:
                any_batch = False
                any_preempted = False
                worst_ms = 0.0
                for r in range(num_dp):
                    g = first_rank + r
                    if rank_policy[g] == POLICY_SGLANG:
                        preempted = build_sglang_batch_nb(
                            g, t, input_tokens, output_tokens, generated, computed, held,
                            sched_n, running, run_len, blocks_used, wait_head,
                            wait_tail, wait_next, wait_prev, first_admit_ns, num_preemptions,
                            rank_max_sequences, rank_num_blocks, rank_block_size,
                            rank_chunk_tokens, rank_max_prefill_tokens, rank_ratio, ratio_params,
                            rank_chunked, rank_extend, rank_prefix_caching[g], prefix_cache, cached_tokens,
                        )
                    else:
                        preempted = build_vllm_batch_nb(
                            g, t, input_tokens, output_tokens, planned, computed, held,
                            sched_n, running, run_len, blocks_used, wait_head,
                            wait_tail, wait_next, wait_prev, first_admit_ns, num_preemptions,
                            rank_max_batched_tokens, rank_max_sequences, rank_num_blocks,
                            rank_block_size, rank_seq_limit, rank_policy[g] == POLICY_TRTLLM,
                            worker_role[w] == ROLE_PREFILL, rank_prefix_caching[g], prefix_cache,
                            cached_tokens, worker_async[w], rank_reserve_full_isl[g],
                        )
                    batch_summary_nb(
                        summary, r, g, running, run_len, sched_n, computed, input_tokens, generated,
                        rank_policy[g] == POLICY_SGLANG and rank_extend[g], worker_role[w] == ROLE_DECODE,
                    )
                    if worker_async[w]:
                        _enqueue_nb(g, slot, preempted, running, run_len, sched_n, computed, input_tokens,
                                    generated, planned, sample_flag, wait_head, wait_next)
                    if summary[r, 0] + summary[r, 3] > 0:
                        any_batch = True
                    any_preempted = any_preempted or preempted
                    ms = rank_time_ms_nb(
                        timing_model,
                        timing_params,
                        timing_table,
                        summary[r, 0],
                        summary[r, 1],
                        summary[r, 2],
                        summary[r, 3],
                        summary[r, 4],
                        summary[r, 6],
                    )
                    if not (ms >= 0.0 and ms < np.inf):
                        _report_bad_batch_nb(bad_batch, w, r, summary, ms)
                        return BAD_TIMING, pass_log_rows, num_emitted
                    rank_ms[r] = ms
                    summary[r, 5] = blocks_used[g]
                    if ms > worst_ms:
                        worst_ms = ms
                if any_batch:
                    if queue:  # it starts when the running pass ends
                        queued[w] = True
                        queued_ms[w] = worst_ms
                        queued_summary[w, :num_dp] = summary[:num_dp]
                        queued_rank_ms[w, :num_dp] = rank_ms[:num_dp]
                        break
                    end = t + max(np.int64(1), np.int64(np.rint(worst_ms * 1e6)))
                    pass_end[w] = end
                    pass_start[w] = t
                    if record_passes:
                        if pass_log_rows + num_dp > pass_log.shape[0]:
                            return PASS_LOG_FULL, pass_log_rows, num_emitted
                        pass_log_rows = _log_pass_nb(
                            pass_log, pass_ms, pass_log_rows, w, num_dp, t, end, summary, rank_ms
                        )
                    break
                if not any_preempted:
                    # Nothing schedulable: the worker stays idle (or nothing is queued).
                    reset_ratio_if_idle_nb(
                        first_rank, num_dp, worker_role[w] == ROLE_DECODE, wait_head, rank_inflight,
                        rank_ratio, ratio_params,
                    )
                    break
                # Only preemptions happened: try again at once (SPEC §5 (e)).
            if queue or not (worker_async[w] and pass_end[w] >= 0):
                w += 1

    return OK, pass_log_rows, num_emitted



@njit(cache=True)
def _enter_rank_nb(
    k, g, t, input_tokens, rank_seq_limit, reject_ns, closed_loop, think_ns,
    send_key, send_val, send_size, wait_head, wait_tail, wait_next, wait_prev, progress,
):
    """Request k reaches rank g at t: rejected if its prompt reaches L, else waits.

    A rejection ends at the client at once, releasing a closed-loop send.
    Returns the send-heap size.
    """
    if input_tokens[k] >= rank_seq_limit[g]:
        reject_ns[k] = t
        progress[0] += 1
        if closed_loop:
            send_size = heap_push_nb(send_key, send_val, send_size, t + think_ns, 0)
    else:
        wait_push_back_nb(wait_head, wait_tail, wait_next, wait_prev, g, k)
    return send_size


@njit(cache=True, parallel=True)
def simulate_batch_nb(requests, load, client, send_ns, topology, ranks, prefix_cache, timing, out, receipts, logs,
                      router, status):
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
        (``timing.params`` and ``timing.table`` zero padded to the widest).
    send_ns : ndarray(int64, ndim=2)
        (C, n) send instants, ns, as in ``simulate_engine_nb``.
    prefix_cache, receipts : tuple of ndarray(int64, ndim=2)
        The ``simcore.scheduler.kv_nb`` and bounded-mode state arrays, each
        stacked to (C, length).
    status : ndarray(int64, ndim=2)
        Out, (C, 3): each configuration's ``(status, num_pass_rows, num_emitted)``.
    """
    for c in prange(send_ns.shape[0]):
        code, rows, emitted = simulate_engine_nb(
            row_nb(requests, c), row_nb(load, c), row_nb(client, c), send_ns[c], row_nb(topology, c),
            row_nb(ranks, c), row_nb(prefix_cache, c), row_nb(timing, c), row_nb(out, c),
            row_nb(receipts, c), row_nb(logs, c), row_nb(router, c),
        )
        status[c, 0] = code
        status[c, 1] = rows
        status[c, 2] = emitted


@intrinsic
def row_nb(typingctx, state, c):
    """Row ``c`` of every member of a tuple (or NamedTuple) of arrays: the batch's per-configuration view.

    A member of shape (C,) gives its scalar, one of shape (C, ...) a C-contiguous
    view of its row; a NamedTuple keeps its class, so the result has the type
    of the single-configuration state (one compiled ``simulate_engine_nb``).

    Parameters
    ----------
    state : tuple or NamedTuple of ndarray
        Members with a leading configuration axis.
    c : int
        Configuration.

    Returns
    -------
    tuple or NamedTuple
        Row ``c`` of each member.
    """
    row_types = [
        member.dtype if member.ndim == 1 else types.Array(member.dtype, member.ndim - 1, member.layout)
        for member in state.types
    ]
    if isinstance(state, types.BaseNamedTuple):
        row_type = types.NamedTuple(row_types, state.instance_class)
    else:
        row_type = types.Tuple(row_types)

    def codegen(context, builder, signature, args):
        value, index = args
        rows = [
            context.compile_internal(
                builder, lambda array, i: array[i], row(member, c), (builder.extract_value(value, m), index)
            )
            for m, (member, row) in enumerate(zip(state.types, row_types))
        ]
        return context.make_tuple(builder, row_type, rows)

    return row_type(state, c), codegen


@njit(cache=True)
def _report_bad_batch_nb(bad_batch, w, r, summary, ms):
    """Record the pass whose time is not finite and >= 0: worker, rank, its five batch summary values, the time."""
    bad_batch[0] = w
    bad_batch[1] = r
    for c in range(5):
        bad_batch[2 + c] = summary[r, c]
    bad_batch[7] = ms


@njit(cache=True)
def _log_pass_nb(pass_log, pass_ms, rows, w, num_dp, start, end, summary, rank_ms):
    """Append one row per rank of worker w's pass (the caller checked the room); returns the row count."""
    for r in range(num_dp):
        pass_log[rows, PASS_WORKER] = w
        pass_log[rows, PASS_RANK] = r
        pass_log[rows, PASS_START] = start
        pass_log[rows, PASS_END] = end
        for c in range(6):
            pass_log[rows, PASS_NUM_PREFILL + c] = summary[r, c]
        pass_ms[rows] = rank_ms[r]
        rows += 1
    return rows


@njit(cache=True)
def _enqueue_nb(g, slot, preempted, running, run_len, sched_n, computed, input_tokens, generated, planned,
                sample_flag, wait_head, wait_next):
    """Asynchronous scheduling: rank g's just-built batch goes into sample slot ``slot``.

    The scheduled tokens count as computed at once (the next build follows them
    without waiting for this pass); a chunk that reaches the request's known
    tokens samples a token, planned until its pass ends.  After a preemption
    every waiting request's in-flight output is dropped (a preempted request
    recomputes and samples again after resumption; the others have none).
    """
    if preempted:
        k = wait_head[g]
        while k >= 0:
            sample_flag[0, k] = False
            sample_flag[1, k] = False
            planned[k] = generated[k]
            k = wait_next[k]
    for i in range(run_len[g]):
        k = running[g, i]
        if sched_n[k] == 0:
            continue
        computed[k] += sched_n[k]
        sched_n[k] = 0
        samples = computed[k] == input_tokens[k] + planned[k]
        sample_flag[slot, k] = samples
        if samples:
            planned[k] += 1
