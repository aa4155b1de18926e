"""The phases of the engine kernel's event loop (``simcore.engine.nb._replay_nb``).

Each phase is one step of SPEC §5's equal-time rule at an instant t: the
steady-decode shortcut, (a) a worker's pass end (with the hand-off and the
emission of each request in it), (b)+(c) the sends (table order, or session
turns) and (d) their tokenizer jobs, engine arrivals and KV-transfer ends,
(e) a worker's pass start.  Every phase is ``inline="always"`` (one call
site each, so inlining costs no code size): the loop's arrays are borrowed
views (``simcore.engine.nb.borrow_nb``), and no call passes them through
numba's reference counting.  The phases read the typed state of
``simcore.engine.state`` and return the counters they change, or keep them
in ``Loop.counts``.  The status codes (``OK``, ``PASS_LOG_FULL``,
``BAD_TIMING``) are the kernel's.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from simcore.receipts_nb import stream_receipts_nb
from simcore.scheduler.gencache_nb import cache_generated_on_release_nb
from simcore.scheduler.kv_tree_nb import prefix_register_nb, prefix_release_nb
from simcore.scheduler.radix_nb import radix_insert_nb, radix_release_nb
from simcore.scheduler.nb import (
    POLICY_SGLANG, batch_summary_nb, POLICY_TRTLLM, build_sglang_batch_nb, reset_ratio_if_idle_nb,
    build_vllm_batch_nb, wait_push_back_nb,
)
from simcore.client.nb import detokenization_service_ns_nb, detokenize_pass_nb
from simcore.heap_nb import heap_pop_nb, heap_push_nb
from simcore.engine.sessions_nb import (
    session_finals_nb, session_next_instant_nb, session_next_send_nb, session_releases_nb,
)
from simcore.enums import (
    DETOK_OFF, DETOK_IN_KERNEL, OUT_FIRST, OUT_FINAL, ROLE_PREFILL, ROLE_DECODE, PASS_WORKER, PASS_RANK, PASS_START,
    PASS_END, PASS_NUM_PREFILL,
)
from simcore.timing.nb import rank_time_ms_nb
from simcore.engine.state import (
    ARR_SIZE, NEXT_ROW, NUM_EMITTED, NUM_HANDOFFS, PASS_LOG_ROWS, SEND_SIZE, SESS_SIZE, XFER_SIZE, Loop,
)
from simcore.engine.router_nb import (
    handoff_rank_nb, route_arrival_nb, route_handoff_nb, route_leave_nb, route_prompt_done_nb, route_send_nb,
)

OK = 0
PASS_LOG_FULL = 1
BAD_TIMING = 2

NO_CAP = np.iinfo(np.int64).max


@njit(cache=True)
def _decode_rank_nb(h, first_decode_worker, num_decode_workers, worker_first_rank, worker_num_ranks):
    """Global decode rank of handoff h: worker h mod Wd, rank (h div Wd) mod Rd (SPEC §3)."""
    w = first_decode_worker + h % num_decode_workers
    return worker_first_rank[w] + (h // num_decode_workers) % worker_num_ranks[w]


@njit(cache=True)
def _has_work_nb(first_rank, num_ranks, run_len, wait_head):
    """Whether any rank of a worker has a running or waiting request."""
    for g in range(first_rank, first_rank + num_ranks):
        if run_len[g] > 0 or wait_head[g] >= 0:
            return True
    return False


@njit(cache=True, inline="always")
def _steady_decode_nb(requests, load, client, send_ns, ranks, timing, out, logs, rq, rk, ps, lp, dt):
    """Steady decode (module docstring) on worker 0's one rank; returns ``OK``, ``BAD_TIMING`` or ``PASS_LOG_FULL``.

    While worker 0's running pass ends before every other event and by the
    cap, every running request decodes one token in it (none its first), none
    finishes or reaches the sequence limit there, and each one's next token
    fits its held blocks and the token budget, the general loop would end that
    pass and build the same batch again (no event, admission, preemption or
    new block): do just that here.
    """
    input_tokens = requests.input_tokens
    output_tokens = requests.output_tokens
    token_offset = requests.token_offset
    n = input_tokens.shape[0]
    closed_loop = load.closed_loop
    think_ns = load.think_ns
    cap_ns = load.cap_ns
    session_mode = load.session_mode
    detok_mode = client.detok_mode
    detok_server = client.detok_server
    detok_workers = client.detok_workers
    detok_params = client.detok_params
    chunk_size = client.chunk_size
    generated = out.generated
    token_emit_ns = out.token_emit_ns
    token_recv_ns = out.token_recv_ns
    emit_log = logs.emit_log
    pass_log = logs.pass_log
    pass_ms = logs.pass_ms
    bad_batch = logs.bad_batch
    record_passes = pass_log.shape[0] > 0
    computed = rq.computed
    held = rq.held
    sched_n = rq.sched_n
    wait_head = rk.wait_head
    running = rk.running
    run_len = rk.run_len
    blocks_used = rk.blocks_used
    pass_end = ps.pass_end
    pass_start = ps.pass_start
    summary = ps.summary
    rank_ms = ps.rank_ms
    arr_key = lp.arr_key
    send_key = lp.send_key
    send_val = lp.send_val
    sess_key = lp.sess_key
    counts = lp.counts
    detok_free = dt.detok_free
    out_token = dt.out_token
    out_server = dt.out_server
    out_flags = dt.out_flags
    recv_target = dt.recv_target
    job_count = dt.job_count
    job_firsts = dt.job_firsts
    job_finals = dt.job_finals
    job_ends = dt.job_ends
    job_tokens = dt.job_tokens
    job_flags = dt.job_flags
    arr_size = counts[ARR_SIZE]
    send_size = counts[SEND_SIZE]
    sess_size = counts[SESS_SIZE]
    next_row = counts[NEXT_ROW]
    num_emitted = counts[NUM_EMITTED]
    pass_log_rows = counts[PASS_LOG_ROWS]
    steady_budget = ranks.max_batched_tokens[0]
    steady_block_size = ranks.block_size[0]
    steady_seq_limit = ranks.seq_limit[0]
    status = OK
    while pass_end[0] >= 0 and wait_head[0] < 0 and run_len[0] <= steady_budget:
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
            timing.model, timing.params, timing.table, 0, 0, 0, run_len[0], decode_kv_tokens, decode_kv_max
        )
        if not (ms >= 0.0 and ms < np.inf):
            _report_bad_batch_nb(bad_batch, 0, 0, summary, ms)
            status = BAD_TIMING
            break
        rank_ms[0] = ms
        summary[0, 5] = blocks_used[0]
        end = t + max(np.int64(1), np.int64(np.rint(ms * 1e6)))
        pass_end[0] = end
        pass_start[0] = t
        if record_passes:
            if pass_log_rows + 1 > pass_log.shape[0]:
                status = PASS_LOG_FULL
                break
            pass_log_rows = _log_pass_nb(pass_log, pass_ms, pass_log_rows, 0, 1, t, end, summary, rank_ms)
    counts[SEND_SIZE] = send_size
    counts[NUM_EMITTED] = num_emitted
    counts[PASS_LOG_ROWS] = pass_log_rows
    return status


@njit(cache=True, inline="always")
def _end_pass_nb(w, t, requests, load, client, topology, ranks, prefix_cache, out, receipts, logs, router,
                 rq, rk, ps, lp, dt):
    """(a) Worker w's pass ends at t: its tokens count, its outputs go to the
    detokenizer, finished requests and prompts handed off leave; then its queued
    asynchronous pass starts.  Returns ``OK`` or ``PASS_LOG_FULL``."""
    input_tokens = requests.input_tokens
    output_tokens = requests.output_tokens
    closed_loop = load.closed_loop
    think_ns = load.think_ns
    cap_ns = load.cap_ns
    session_mode = load.session_mode
    detok_mode = client.detok_mode
    detok_workers = client.detok_workers
    detok_params = client.detok_params
    chunk_size = client.chunk_size
    worker_role = topology.worker_role
    worker_first_rank = topology.worker_first_rank
    worker_num_ranks = topology.worker_num_ranks
    rank_num_blocks = ranks.num_blocks
    rank_block_size = ranks.block_size
    rank_seq_limit = ranks.seq_limit
    rank_policy = ranks.policy
    rank_prefix_caching = ranks.prefix_caching
    ratio_params = ranks.ratio_params
    generated = out.generated
    pass_log = logs.pass_log
    pass_ms = logs.pass_ms
    record_passes = pass_log.shape[0] > 0
    bounded = receipts[0].shape[0] > 0
    computed = rq.computed
    sched_n = rq.sched_n
    sample_flag = rq.sample_flag
    wait_head = rk.wait_head
    running = rk.running
    run_len = rk.run_len
    blocks_used = rk.blocks_used
    rank_ratio = rk.ratio
    rank_extend = rk.extend
    rank_inflight = rk.inflight
    pass_end = ps.pass_end
    pass_start = ps.pass_start
    run_slot = ps.run_slot
    queued = ps.queued
    queued_ms = ps.queued_ms
    queued_summary = ps.queued_summary
    queued_rank_ms = ps.queued_rank_ms
    send_key = lp.send_key
    send_val = lp.send_val
    counts = lp.counts
    detok_free = dt.detok_free
    out_token = dt.out_token
    out_req = dt.out_req
    out_recv = dt.out_recv
    recv_target = dt.recv_target
    out_server = dt.out_server
    out_flags = dt.out_flags
    job_count = dt.job_count
    job_firsts = dt.job_firsts
    job_finals = dt.job_finals
    job_ends = dt.job_ends
    job_tokens = dt.job_tokens
    job_flags = dt.job_flags
    xfer_size = counts[XFER_SIZE]
    send_size = counts[SEND_SIZE]
    num_handoffs = counts[NUM_HANDOFFS]
    num_emitted = counts[NUM_EMITTED]

    pass_end[w] = -1
    hidden = worker_role[w] == ROLE_PREFILL
    asynchronous = topology.worker_async[w]
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
                    leaves = True
                    xfer_size, num_handoffs = _hand_off_nb(
                        k, g, t, xfer_size, num_handoffs, requests, topology, prefix_cache, ranks, out, router, rk, lp
                    )
                else:
                    leaves, num_out, num_emitted, send_size = _emit_nb(
                        k, g, t, num_out, num_emitted, send_size, requests, load, client, ranks, prefix_cache, out,
                        logs, receipts, rq, rk, lp, dt,
                    )
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
    counts[XFER_SIZE] = xfer_size
    counts[SEND_SIZE] = send_size
    counts[NUM_HANDOFFS] = num_handoffs
    counts[NUM_EMITTED] = num_emitted
    if queued[w]:  # asynchronous: the pass built at this one's start runs now
        queued[w] = False
        run_slot[w] = 1 - slot
        pass_start[w] = t
        pass_end[w] = t + max(np.int64(1), np.int64(np.rint(queued_ms[w] * 1e6)))
        if record_passes:
            pass_log_rows = counts[PASS_LOG_ROWS]
            if pass_log_rows + worker_num_ranks[w] > pass_log.shape[0]:
                return PASS_LOG_FULL
            counts[PASS_LOG_ROWS] = _log_pass_nb(
                pass_log, pass_ms, pass_log_rows, w, worker_num_ranks[w], t, pass_end[w],
                queued_summary[w], queued_rank_ms[w],
            )
    return OK


@njit(cache=True, inline="always")
def _hand_off_nb(k, g, t, xfer_size, num_handoffs, requests, topology, prefix_cache, ranks, out, router, rk, lp):
    """(a) on a prefill worker: request k's prompt is computed on rank g at t and
    handed off; the sampled token is not sent and the blocks stay held until
    the transfer ends (SPEC §6).  Returns the new ``xfer_size`` and ``num_handoffs``."""
    input_tokens = requests.input_tokens
    transfer_ns = requests.transfer_ns
    worker_first_rank = topology.worker_first_rank
    worker_num_ranks = topology.worker_num_ranks
    num_decode_workers = topology.num_decode_workers
    first_decode_worker = topology.worker_role.shape[0] - num_decode_workers
    rank_num_blocks = ranks.num_blocks
    rank_block_size = ranks.block_size
    handoff_ns = out.handoff_ns
    decode_router_policy = router.decode_policy
    worker_rank_policy = router.rank_policy
    router_weights = router.weights
    decode_draws = router.decode_draws
    run_len = rk.run_len
    blocks_used = rk.blocks_used
    rank_inflight = rk.inflight
    xfer_key = lp.xfer_key
    xfer_val = lp.xfer_val
    handoff_req = lp.handoff_req
    route = lp.route
    routing = lp.routing
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
    return xfer_size, num_handoffs


@njit(cache=True, inline="always")
def _emit_nb(k, g, t, num_out, num_emitted, send_size, requests, load, client, ranks, prefix_cache, out, logs, receipts,
             rq, rk, lp, dt):
    """(a) request k emits its next token on rank g at t (to the detokenizer's
    job of its server, or received at once, or logged); a finished request leaves.
    Returns whether it leaves, and the new ``num_out``, ``num_emitted`` and ``send_size``."""
    input_tokens = requests.input_tokens
    output_tokens = requests.output_tokens
    token_offset = requests.token_offset
    closed_loop = load.closed_loop
    think_ns = load.think_ns
    session_mode = load.session_mode
    detok_mode = client.detok_mode
    detok_server = client.detok_server
    rank_seq_limit = ranks.seq_limit
    first_emit_ns = out.first_emit_ns
    finish_ns = out.finish_ns
    generated = out.generated
    token_emit_ns = out.token_emit_ns
    progress = out.progress
    emit_log = logs.emit_log
    bounded = receipts[0].shape[0] > 0
    computed = rq.computed
    held = rq.held
    blocks_used = rk.blocks_used
    send_key = lp.send_key
    send_val = lp.send_val
    route = lp.route
    routing = lp.routing
    out_token = dt.out_token
    out_req = dt.out_req
    recv_target = dt.recv_target
    out_server = dt.out_server
    out_flags = dt.out_flags
    job_count = dt.job_count
    job_firsts = dt.job_firsts
    job_finals = dt.job_finals
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
        _free_blocks_nb(prefix_cache, ranks, g, k, computed[k], held, blocks_used)  # prompt + output - 1 tokens
    return leaves, num_out, num_emitted, send_size


@njit(cache=True, inline="always")
def _send_nb(k, s, t, requests, load, client, topology, ranks, prefix_cache, out, router, rk, lp):
    """Send row k at t as send number s (s = k in table order; with sessions the
    send sequence number): place it, then queue its tokenizer job, FIFO per
    server in send order, whose end is its engine arrival (keyed by s)."""
    tok_server = client.tok_server
    tok_service_ns = client.tok_service_ns
    tok_free = lp.tok_free
    counts = lp.counts
    if lp.routing:  # the router picks the worker, whose tokenizer takes the request
        first_decode_worker = topology.worker_role.shape[0] - topology.num_decode_workers
        w = route_send_nb(
            lp.route, s, k, router.policy, router.rank_policy, 0, first_decode_worker, router.draws, router.weights,
            requests.input_tokens, topology.worker_first_rank, topology.worker_num_ranks, rk.run_len,
            rk.blocks_used, ranks.num_blocks, ranks.block_size, prefix_cache, out.placed_rank,
        )
        out.placed_worker[k] = w
        server = w * router.tok_workers + router.tok_index[k]
    elif load.session_mode:  # the placement of send sequence number s (SPEC §3)
        out.placed_rank[k] = load.seq_rank[s]
        server = load.seq_tok_base[s] + tok_server[k]
    else:
        server = tok_server[k]
    end = max(t, tok_free[server]) + tok_service_ns[k]
    tok_free[server] = end
    counts[ARR_SIZE] = heap_push_nb(lp.arr_key, lp.arr_val, counts[ARR_SIZE], end, s)


@njit(cache=True, inline="always")
def _session_sends_nb(t, requests, load, client, send_ns, topology, ranks, prefix_cache, out, router, rk, lp):
    """(c) with sessions: the releases at t, then the sends they make (row order). Returns whether any happened."""
    sess_key = lp.sess_key
    sess_val = lp.sess_val
    session_counters = lp.session_counters
    counts = lp.counts
    send_size, sess_size, progressed = session_releases_nb(
        t, load.session_closed, load.session_think_ns, load.next_turn, load.turn_think_ns, load.session_first,
        lp.send_key, lp.send_val, counts[SEND_SIZE], sess_key, sess_val, counts[SESS_SIZE], session_counters,
    )
    counts[SEND_SIZE] = send_size
    while True:
        sess_size, k, s = session_next_send_nb(
            t, sess_key, sess_val, sess_size, session_counters, send_ns, out.send_seq, lp.seq_row
        )
        if k < 0:
            break
        progressed = True
        _send_nb(k, s, t, requests, load, client, topology, ranks, prefix_cache, out, router, rk, lp)
    counts[SESS_SIZE] = sess_size
    return progressed


@njit(cache=True, inline="always")
def _table_sends_nb(t, requests, load, client, send_ns, topology, ranks, prefix_cache, out, router, rk, lp):
    """(b)+(c) the sends at t in table order (closed loop: as many as the send heap releases at t).
    Returns whether any happened."""
    n = requests.input_tokens.shape[0]
    closed_loop = load.closed_loop
    send_key = lp.send_key
    send_val = lp.send_val
    counts = lp.counts
    send_size = counts[SEND_SIZE]
    next_row = counts[NEXT_ROW]
    progressed = False
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
        _send_nb(k, k, t, requests, load, client, topology, ranks, prefix_cache, out, router, rk, lp)
    counts[SEND_SIZE] = send_size
    counts[NEXT_ROW] = next_row
    return progressed


@njit(cache=True, inline="always")
def _arrivals_nb(t, requests, load, topology, ranks, out, rq, rk, lp):
    """(d) the engine arrivals at t, in send order; rejections end at once. Returns whether any happened."""
    session_mode = load.session_mode
    worker_first_rank = topology.worker_first_rank
    worker_num_ranks = topology.worker_num_ranks
    rank_num_blocks = ranks.num_blocks
    arrival_ns = out.arrival_ns
    recv_rank = out.placed_rank
    run_len = rk.run_len
    blocks_used = rk.blocks_used
    arr_key = lp.arr_key
    arr_val = lp.arr_val
    seq_row = lp.seq_row
    route = lp.route
    routing = lp.routing
    counts = lp.counts
    arr_size = counts[ARR_SIZE]
    progressed = False
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
        _enter_rank_nb(k, recv_rank[k], t, requests, load, ranks, out, rq, rk, lp)
    counts[ARR_SIZE] = arr_size
    return progressed


@njit(cache=True, inline="always")
def _transfer_ends_nb(t, requests, load, topology, ranks, prefix_cache, out, rq, rk, lp):
    """(d) the KV-transfer ends at t, in handoff order: free the prefill blocks
    and enter the decode rank (h mod Wd, (h div Wd) mod Rd, or the one routed at
    the handoff). Returns whether any happened."""
    input_tokens = requests.input_tokens
    worker_first_rank = topology.worker_first_rank
    worker_num_ranks = topology.worker_num_ranks
    num_decode_workers = topology.num_decode_workers
    first_decode_worker = topology.worker_role.shape[0] - num_decode_workers
    rank_num_blocks = ranks.num_blocks
    rank_block_size = ranks.block_size
    rank_policy = ranks.policy
    rank_prefix_caching = ranks.prefix_caching
    transfer_end_ns = out.transfer_end_ns
    decode_rank = out.decode_rank
    recv_rank = out.placed_rank
    computed = rq.computed
    held = rq.held
    blocks_used = rk.blocks_used
    rank_inflight = rk.inflight
    xfer_key = lp.xfer_key
    xfer_val = lp.xfer_val
    handoff_req = lp.handoff_req
    route = lp.route
    routing = lp.routing
    counts = lp.counts
    xfer_size = counts[XFER_SIZE]
    progressed = False
    while xfer_size > 0 and xfer_key[0] == t:
        h = xfer_val[0]
        xfer_size = heap_pop_nb(xfer_key, xfer_val, xfer_size)
        progressed = True
        k = handoff_req[h]
        if rank_policy[recv_rank[k]] == POLICY_SGLANG and rank_prefix_caching[recv_rank[k]]:
            radix_insert_nb(prefix_cache, recv_rank[k], rank_num_blocks.shape[0], k, input_tokens[k],
                            rank_block_size[recv_rank[k]], blocks_used)  # cache_finished_req
        _free_blocks_nb(prefix_cache, ranks, recv_rank[k], k, input_tokens[k], held, blocks_used)
        transfer_end_ns[k] = t
        if routing:
            g = handoff_rank_nb(route, h)
        else:
            g = _decode_rank_nb(h, first_decode_worker, num_decode_workers, worker_first_rank, worker_num_ranks)
        rank_inflight[recv_rank[k]] -= 1
        rank_inflight[g] -= 1
        decode_rank[k] = g
        computed[k] = input_tokens[k] - 1
        _enter_rank_nb(k, g, t, requests, load, ranks, out, rq, rk, lp)
    counts[XFER_SIZE] = xfer_size
    return progressed


@njit(cache=True, inline="always")
def _start_pass_nb(w, t, queue, requests, topology, ranks, prefix_cache, timing, out, logs, rq, rk, ps, lp):
    """(e) Idle worker w starts a pass at t (``queue``: asynchronous, builds the
    one that starts when its running pass ends); preemptions alone retry at
    once (SPEC §5 (e)).  Returns ``OK``, ``BAD_TIMING`` or ``PASS_LOG_FULL``."""
    input_tokens = requests.input_tokens
    worker_role = topology.worker_role
    worker_async = topology.worker_async
    rank_policy = ranks.policy
    ratio_params = ranks.ratio_params
    timing_model = timing.model
    timing_params = timing.params
    timing_table = timing.table
    generated = out.generated
    pass_log = logs.pass_log
    pass_ms = logs.pass_ms
    bad_batch = logs.bad_batch
    record_passes = pass_log.shape[0] > 0
    computed = rq.computed
    sched_n = rq.sched_n
    wait_next = rq.wait_next
    planned = rq.planned
    sample_flag = rq.sample_flag
    wait_head = rk.wait_head
    running = rk.running
    run_len = rk.run_len
    blocks_used = rk.blocks_used
    rank_ratio = rk.ratio
    rank_extend = rk.extend
    rank_inflight = rk.inflight
    pass_end = ps.pass_end
    pass_start = ps.pass_start
    summary = ps.summary
    rank_ms = ps.rank_ms
    run_slot = ps.run_slot
    queued = ps.queued
    queued_ms = ps.queued_ms
    queued_summary = ps.queued_summary
    queued_rank_ms = ps.queued_rank_ms
    counts = lp.counts

    first_rank = topology.worker_first_rank[w]
    num_dp = topology.worker_num_ranks[w]
    slot = 1 - run_slot[w] if queue else run_slot[w]
    while True:
        any_batch = False
        any_preempted = False
        worst_ms = 0.0
        for r in range(num_dp):
            g = first_rank + r
            if rank_policy[g] == POLICY_SGLANG:
                preempted = build_sglang_batch_nb(g, t, requests, ranks, prefix_cache, out, rq, rk)
            else:
                preempted = build_vllm_batch_nb(
                    g, t, worker_role[w] == ROLE_PREFILL, worker_async[w], requests, ranks, prefix_cache, out, rq, rk
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
                return BAD_TIMING
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
                return OK
            end = t + max(np.int64(1), np.int64(np.rint(worst_ms * 1e6)))
            pass_end[w] = end
            pass_start[w] = t
            if record_passes:
                pass_log_rows = counts[PASS_LOG_ROWS]
                if pass_log_rows + num_dp > pass_log.shape[0]:
                    return PASS_LOG_FULL
                counts[PASS_LOG_ROWS] = _log_pass_nb(
                    pass_log, pass_ms, pass_log_rows, w, num_dp, t, end, summary, rank_ms
                )
            return OK
        if not any_preempted:
            # Nothing schedulable: the worker stays idle (or nothing is queued).
            reset_ratio_if_idle_nb(
                first_rank, num_dp, worker_role[w] == ROLE_DECODE, wait_head, rank_inflight,
                rank_ratio, ratio_params,
            )
            return OK


@njit(cache=True, inline="always")
def _free_blocks_nb(prefix_cache, ranks, g, k, tokens, held, blocks_used):
    """Request k leaves rank g (finished, or its prompt handed off) with ``tokens`` computed.

    TensorRT-LLM first stores its blocks for reuse (``storeBlocksForReuse``),
    vLLM with ``cache_generated_blocks`` registers its generated ones;
    SGLang unlocks its radix-tree path; the other blocks are freed.
    """
    if ranks.policy[g] == POLICY_TRTLLM and ranks.prefix_caching[g]:
        prefix_register_nb(prefix_cache, g, ranks.num_blocks.shape[0], k, tokens, ranks.block_size[g], blocks_used)
    cache_generated_on_release_nb(prefix_cache, ranks, g, k, tokens, blocks_used)
    if ranks.policy[g] == POLICY_SGLANG:
        radix_release_nb(prefix_cache, g, k, held, blocks_used)
    else:
        prefix_release_nb(prefix_cache, g, k, held, blocks_used)


@njit(cache=True, inline="always")
def _enter_rank_nb(k, g, t, requests, load, ranks, out, rq, rk, lp):
    """Request k reaches rank g at t: rejected if its prompt reaches L, else waits.

    A rejection ends at the client at once: it releases a closed-loop send
    (after the think time) or, with sessions, the session's next turn, and
    the request leaves the router's counts.
    """
    counts = lp.counts
    if requests.input_tokens[k] >= ranks.seq_limit[g]:
        out.reject_ns[k] = t
        out.progress[0] += 1
        if load.closed_loop:
            counts[SEND_SIZE] = heap_push_nb(lp.send_key, lp.send_val, counts[SEND_SIZE], t + load.think_ns, 0)
        if lp.routing:
            route_prompt_done_nb(lp.route, k, requests.input_tokens[k])
            route_leave_nb(lp.route, k, g)
        if load.session_mode:
            counts[SEND_SIZE] = heap_push_nb(lp.send_key, lp.send_val, counts[SEND_SIZE], t, k)
    else:
        wait_push_back_nb(rk.wait_head, rk.wait_tail, rq.wait_next, rq.wait_prev, g, k)


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
