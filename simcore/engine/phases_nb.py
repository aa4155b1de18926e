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
    POLICY_SGLANG, POLICY_VLLM, batch_summary_nb, POLICY_TRTLLM, build_sglang_batch_nb, reset_ratio_if_idle_nb,
    build_vllm_batch_nb, wait_insert_nb, wait_push_back_nb, ORDER_FCFS, ORDER_RANDOM,
)
from simcore.client.nb import detokenize_pass_nb
from simcore.scheduler.spec_nb import spec_proposer_ms_nb, spec_verify_nb
from simcore.heap_nb import heap_pop_nb, heap_push_nb
from simcore.engine.sessions_nb import (
    session_finals_nb, session_next_instant_nb, session_next_send_nb, session_releases_nb,
)
from simcore.enums import (
    DETOK_OFF, DETOK_IN_KERNEL, OUT_FIRST, OUT_FINAL, ROLE_PREFILL, ROLE_DECODE, PASS_WORKER, PASS_RANK, PASS_START,
    PASS_END, PASS_NUM_PREFILL,
)
from simcore.timing.nb import lockstep_times_nb, rank_time_ms_nb
from simcore.engine.state import (
    ARR_SIZE, NEXT_ROW, NUM_EMITTED, NUM_HANDOFFS, PASS_LOG_ROWS, SEND_SIZE, SESS_SIZE, XFER_SIZE,
)
from simcore.engine.failures_nb import any_up_nb, lose_nb, retry_pop_nb
from simcore.engine.autoscale_nb import METRIC_ITL, METRIC_TTFT, scale_sample_nb
from simcore.engine.router_nb import (
    handoff_rank_nb, route_arrival_nb, route_handoff_nb, route_leave_nb, route_prompt_done_nb, route_send_nb,
)

OK = 0
PASS_LOG_FULL = 1
BAD_TIMING = 2
SCALE_LOG_FULL = 3

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
def _steady_decode_nb(run, state):
    """Steady decode (module docstring) on worker 0's one rank; returns ``OK``, ``BAD_TIMING`` or ``PASS_LOG_FULL``.

    While worker 0's running pass ends before every other event and by the
    cap, every running request decodes one token in it (none its first), none
    finishes or reaches the sequence limit there, and each one's next token
    fits its held blocks and the token budget, the general loop would end that
    pass and build the same batch again (no event, admission, preemption or
    new block): do just that here.
    """
    requests, load, client, send_ns, ranks = run.requests, run.load, run.client, run.out.send_ns, run.ranks
    timing, out, logs = run.timing, run.out, run.logs
    rq, rk, ps, lp, dt = state.rq, state.rk, state.ps, state.lp, state.dt
    n = requests.input_tokens.shape[0]
    record_passes = logs.pass_log.shape[0] > 0
    arr_size = lp.counts[ARR_SIZE]
    send_size = lp.counts[SEND_SIZE]
    sess_size = lp.counts[SESS_SIZE]
    next_row = lp.counts[NEXT_ROW]
    num_emitted = lp.counts[NUM_EMITTED]
    pass_log_rows = lp.counts[PASS_LOG_ROWS]
    steady_budget = ranks.max_batched_tokens[0]
    steady_block_size = ranks.block_size[0]
    steady_seq_limit = ranks.seq_limit[0]
    status = OK
    while ps.pass_end[0] >= 0 and rk.wait_head[0] < 0 and rk.run_len[0] <= steady_budget and ranks.spec_drafts[0] == 0:
        t = ps.pass_end[0]
        if t > load.cap_ns or arr_size > 0 and lp.arr_key[0] <= t:
            break
        if load.closed_loop:
            if send_size > 0 and next_row < n and lp.send_key[0] <= t:
                break
        elif next_row < n and send_ns[next_row] <= t:
            break
        if load.session_mode and session_next_instant_nb(t + 1, lp.send_key, send_size, lp.sess_key, sess_size) <= t:
            break
        steady = True
        for i in range(rk.run_len[0]):
            k = rk.running[0, i]
            j = out.generated[k]
            if not (
                rq.sched_n[k] == 1 and j >= 1 and rq.computed[k] == requests.input_tokens[k] + j - 1
                and j + 1 < requests.output_tokens[k] and requests.input_tokens[k] + j + 1 < steady_seq_limit
                and rq.computed[k] + 2 <= rq.held[k] * steady_block_size
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
        for i in range(rk.run_len[0]):
            k = rk.running[0, i]
            rq.computed[k] += 1
            decode_kv_tokens += rq.computed[k] + 1
            decode_kv_max = max(decode_kv_max, rq.computed[k] + 1)
            j = out.generated[k]
            out.generated[k] = j + 1
            tok = requests.token_offset[k] + j
            out.token_emit_ns[tok] = t
            if client.detok_mode == DETOK_OFF:
                out.token_recv_ns[tok] = t
            elif client.detok_mode == DETOK_IN_KERNEL:
                srv = client.detok_server[k]
                dt.out_token[num_out] = tok
                dt.out_server[num_out] = srv
                dt.out_flags[num_out] = 0
                num_out += 1
                dt.job_count[srv] += 1
            num_emitted += 1
        if num_out > 0:  # worker 0's servers; no request-final token among them: no send is queued
            send_size = detokenize_pass_nb(
                t, 0, num_out, dt, client.chunk_size, client.detok_params, load.closed_loop, load.think_ns,
                lp.send_key, lp.send_val, send_size,
            )
        ps.summary[0, 0] = 0
        ps.summary[0, 1] = 0
        ps.summary[0, 2] = 0
        ps.summary[0, 3] = rk.run_len[0]
        ps.summary[0, 4] = decode_kv_tokens
        ps.summary[0, 6] = decode_kv_max
        span = timing.worker_span[0]
        ms = rank_time_ms_nb(
            timing.worker_model[0], timing.params[span[0]:span[1]], timing.table[span[2]:span[3]], 0, 0, 0,
            rk.run_len[0], decode_kv_tokens, decode_kv_max,
        )
        if not (ms >= 0.0 and ms < np.inf):
            _report_bad_batch_nb(logs.bad_batch, 0, 0, ps.summary, ms)
            status = BAD_TIMING
            break
        ps.rank_ms[0] = ms
        ps.summary[0, 5] = rk.blocks_used[0]
        end = t + max(np.int64(1), np.int64(np.rint(ms * 1e6)))
        ps.pass_end[0] = end
        ps.pass_start[0] = t
        if record_passes:
            if pass_log_rows + 1 > logs.pass_log.shape[0]:
                status = PASS_LOG_FULL
                break
            pass_log_rows = _log_pass_nb(
                logs.pass_log, logs.pass_ms, pass_log_rows, 0, 1, t, end, ps.summary, ps.rank_ms
            )
    lp.counts[SEND_SIZE] = send_size
    lp.counts[NUM_EMITTED] = num_emitted
    lp.counts[PASS_LOG_ROWS] = pass_log_rows
    return status


@njit(cache=True, inline="always")
def _end_pass_nb(w, t, run, state):
    """(a) Worker w's pass ends at t: its tokens count, its outputs go to the
    detokenizer, finished requests and prompts handed off leave; then its queued
    asynchronous pass starts.  Returns ``OK`` or ``PASS_LOG_FULL``."""
    requests, load, client, topology, ranks = run.requests, run.load, run.client, run.topology, run.ranks
    out, receipts, logs = run.out, run.receipts, run.logs
    rq, rk, ps, lp, dt = state.rq, state.rk, state.ps, state.lp, state.dt
    record_passes = logs.pass_log.shape[0] > 0
    bounded = receipts[0].shape[0] > 0
    xfer_size = lp.counts[XFER_SIZE]
    send_size = lp.counts[SEND_SIZE]
    num_handoffs = lp.counts[NUM_HANDOFFS]
    num_emitted = lp.counts[NUM_EMITTED]

    ps.pass_end[w] = -1
    hidden = topology.worker_role[w] == ROLE_PREFILL
    asynchronous = topology.worker_async[w]
    slot = ps.run_slot[w]
    num_out = 0
    for g in range(topology.worker_first_rank[w], topology.worker_first_rank[w] + topology.worker_num_ranks[w]):
        keep = 0
        # SGLang inserts a prompt once computed and a request as it finishes.
        radix_inserts = ranks.policy[g] == POLICY_SGLANG and ranks.prefix_caching[g] and not asynchronous
        for i in range(rk.run_len[g]):
            k = rk.running[g, i]
            leaves = False
            samples = False
            accepted = 0  # a verification's accepted proposals, emitted after its sampled token
            n_tok = rq.sched_n[k]
            if n_tok > 0:  # synchronous: the pass's tokens are computed now
                rq.computed[k] += n_tok
                rq.sched_n[k] = 0
                samples = rq.computed[k] == requests.input_tokens[k] + out.generated[k]
                if n_tok > 1 and rq.drafts[k] > 0:  # a verification (1 + its proposals); its rejected
                    drafts = rq.drafts[k]  # proposals' slots are computed again (docs/speculative.md)
                    rq.drafts[k] = 0
                    accepted = spec_verify_nb(ranks.spec_key[g], ranks.spec_positions[g], ranks.spec_rates, g, k,
                                              requests.token_offset[k], out.generated[k], requests.spec_alpha,
                                              requests.spec_stream, drafts, out.spec_counts)
                    samples = True
                    rq.computed[k] = requests.input_tokens[k] + out.generated[k]
            elif asynchronous:  # computed advanced when the pass was built
                samples = rq.sample_flag[slot, k]
                rq.sample_flag[slot, k] = False
            if samples:
                leaves, xfer_size, num_handoffs, num_out, num_emitted, send_size = _sampled_nb(
                    k, g, t, hidden, radix_inserts, xfer_size, num_handoffs, num_out, num_emitted, send_size,
                    run, state,
                )
                # a verification's accepted proposals, each sampled at t in turn (docs/speculative.md)
                while accepted > 0 and not leaves:
                    accepted -= 1
                    rq.computed[k] = requests.input_tokens[k] + out.generated[k]  # computed when it is sampled
                    leaves, xfer_size, num_handoffs, num_out, num_emitted, send_size = _sampled_nb(
                        k, g, t, hidden, radix_inserts, xfer_size, num_handoffs, num_out, num_emitted, send_size,
                        run, state,
                    )
            if not leaves:
                rk.running[g, keep] = k
                keep += 1
        rk.run_len[g] = keep
    if not _has_work_nb(topology.worker_first_rank[w], topology.worker_num_ranks[w], rk.run_len, rk.wait_head):
        reset_ratio_if_idle_nb(
            topology.worker_first_rank[w], topology.worker_num_ranks[w], topology.worker_role[w] == ROLE_DECODE,
            rk.wait_head, rk.inflight, rk.ratio, ranks.ratio_params,
        )

    # (b) this pass's detokenizer jobs: per server, in server order,
    # the server's outputs in rank then running order, cut in chunks.
    if client.detok_mode == DETOK_IN_KERNEL and num_out > 0:
        send_size = detokenize_pass_nb(
            t, w * client.detok_workers, num_out, dt, client.chunk_size, client.detok_params, load.closed_loop,
            load.think_ns, lp.send_key, lp.send_val, send_size,
        )
    if load.session_mode and client.detok_mode == DETOK_IN_KERNEL and num_out > 0:
        send_size = session_finals_nb(
            num_out, dt.out_req, dt.out_token, dt.out_flags, dt.recv_target, lp.send_key, lp.send_val, send_size
        )
    if bounded and num_out > 0:
        stream_receipts_nb(num_out, dt.out_req, dt.out_recv, load.cap_ns, receipts)
    lp.counts[XFER_SIZE] = xfer_size
    lp.counts[SEND_SIZE] = send_size
    lp.counts[NUM_HANDOFFS] = num_handoffs
    lp.counts[NUM_EMITTED] = num_emitted
    if ps.queued[w]:  # asynchronous: the pass built at this one's start runs now
        ps.queued[w] = False
        ps.run_slot[w] = 1 - slot
        ps.pass_start[w] = t
        ps.pass_end[w] = t + max(np.int64(1), np.int64(np.rint(ps.queued_ms[w] * 1e6)))
        if record_passes:
            pass_log_rows = lp.counts[PASS_LOG_ROWS]
            if pass_log_rows + topology.worker_num_ranks[w] > logs.pass_log.shape[0]:
                return PASS_LOG_FULL
            lp.counts[PASS_LOG_ROWS] = _log_pass_nb(
                logs.pass_log, logs.pass_ms, pass_log_rows, w, topology.worker_num_ranks[w], t, ps.pass_end[w],
                ps.queued_summary[w], ps.queued_rank_ms[w],
            )
    return OK


@njit(cache=True, inline="always")
def _sampled_nb(k, g, t, hidden, radix_inserts, xfer_size, num_handoffs, num_out, num_emitted, send_size, run, state):
    """(a) request k samples a token on rank g at t: SGLang's radix insert (a prompt once
    computed, a request as it finishes), then the hand-off (prefill worker) or the emit.
    Returns whether it leaves and the updated counts."""
    requests, ranks, prefix_cache, out = run.requests, run.ranks, run.prefix_cache, run.out
    rq, rk = state.rq, state.rk
    if radix_inserts and (
        rk.extend[g] or out.generated[k] + 1 == requests.output_tokens[k]
        or requests.input_tokens[k] + out.generated[k] + 1 >= ranks.seq_limit[g]
    ):
        radix_insert_nb(prefix_cache, g, ranks.num_blocks.shape[0], k, rq.computed[k], ranks.block_size[g],
                        rk.blocks_used)
    if hidden:
        xfer_size, num_handoffs = _hand_off_nb(k, g, t, xfer_size, num_handoffs, run, state)
        return True, xfer_size, num_handoffs, num_out, num_emitted, send_size
    leaves, num_out, num_emitted, send_size = _emit_nb(k, g, t, num_out, num_emitted, send_size, run, state)
    return leaves, xfer_size, num_handoffs, num_out, num_emitted, send_size


@njit(cache=True, inline="always")
def _hand_off_nb(k, g, t, xfer_size, num_handoffs, run, state):
    """(a) on a prefill worker: request k's prompt is computed on rank g at t and
    handed off; the sampled token is not sent and the blocks stay held until
    the transfer ends (SPEC §6).  Returns the new ``xfer_size`` and ``num_handoffs``."""
    requests, topology, ranks, prefix_cache, out = run.requests, run.topology, run.ranks, run.prefix_cache, run.out
    router = run.router
    rk, lp = state.rk, state.lp
    first_decode_worker = topology.worker_role.shape[0] - topology.num_decode_workers
    out.handoff_ns[k] = t
    lp.handoff_req[num_handoffs] = k
    xfer_size = heap_push_nb(
        lp.xfer_key, lp.xfer_val, xfer_size, t + requests.transfer_ns[k], num_handoffs
    )
    rk.inflight[g] += 1
    if lp.routing:
        route_prompt_done_nb(lp.route, k, requests.input_tokens[k])
        route_leave_nb(lp.route, k, g)
        to_rank = route_handoff_nb(
            lp.route, num_handoffs, k, router.decode_policy, router.rank_policy,
            first_decode_worker, topology.num_decode_workers, router.decode_draws, router.weights,
            requests.input_tokens[k], topology.worker_first_rank, topology.worker_num_ranks, rk.run_len,
            rk.blocks_used, ranks.num_blocks, ranks.block_size, prefix_cache,
        )
    else:
        to_rank = _decode_rank_nb(
            num_handoffs, first_decode_worker, topology.num_decode_workers,
            topology.worker_first_rank, topology.worker_num_ranks,
        )
    rk.inflight[to_rank] += 1
    num_handoffs += 1
    return xfer_size, num_handoffs


@njit(cache=True, inline="always")
def _emit_nb(k, g, t, num_out, num_emitted, send_size, run, state):
    """(a) request k emits its next token on rank g at t (to the detokenizer's
    job of its server, or received at once); a finished request leaves.
    Returns whether it leaves, and the new ``num_out``, ``num_emitted`` and ``send_size``."""
    requests, load, client, ranks, prefix_cache = run.requests, run.load, run.client, run.ranks, run.prefix_cache
    out, receipts = run.out, run.receipts
    rq, rk, lp, dt = state.rq, state.rk, state.lp, state.dt
    bounded = receipts[0].shape[0] > 0
    j = out.generated[k]
    out.generated[k] = j + 1
    tok = requests.token_offset[k] + j
    if j == 0:
        out.first_emit_ns[k] = t
        if lp.routing:
            route_prompt_done_nb(lp.route, k, requests.input_tokens[k])
    leaves = (
        j + 1 == requests.output_tokens[k]
        or requests.input_tokens[k] + j + 1 >= ranks.seq_limit[g]
    )
    if lp.scale.shape[0] > 0:  # autoscaling on latencies: this token's TTFT or gap (docs/autoscaling.md)
        if j == 0:
            scale_sample_nb(lp.scale, run.router.scale, METRIC_TTFT, t - out.send_ns[k])
        elif not bounded:
            scale_sample_nb(lp.scale, run.router.scale, METRIC_ITL, t - out.token_emit_ns[tok - 1])
    dt.out_req[num_out] = k
    if bounded:
        tok = num_out
    else:
        out.token_emit_ns[tok] = t
    if client.detok_mode == DETOK_OFF:
        dt.recv_target[tok] = t  # received as emitted
        num_out += bounded  # bounded: streamed at the pass end
        if leaves and load.closed_loop:
            send_size = heap_push_nb(
                lp.send_key, lp.send_val, send_size, t + load.think_ns, 0
            )
        if leaves and load.session_mode:  # ends at the client now
            send_size = heap_push_nb(lp.send_key, lp.send_val, send_size, t, k)
    elif client.detok_mode == DETOK_IN_KERNEL:
        srv = client.detok_server[k]
        dt.out_token[num_out] = tok
        dt.out_server[num_out] = srv
        dt.out_flags[num_out] = (j == 0) * OUT_FIRST + leaves * OUT_FINAL
        num_out += 1
        # The server's job so far (one job per server
        # per pass unless chunked).
        dt.job_count[srv] += 1
        dt.job_firsts[srv] += j == 0
        dt.job_finals[srv] += leaves
    num_emitted += 1
    if leaves:
        out.finish_ns[k] = t
        out.progress[0] += 1
        if lp.routing:
            route_leave_nb(lp.route, k, g)
        # prompt + output - 1 tokens
        _free_blocks_nb(prefix_cache, ranks, g, k, rq.computed[k], rq.held, rk.blocks_used)
    return leaves, num_out, num_emitted, send_size


@njit(cache=True, inline="always")
def _send_nb(k, s, t, run, state):
    """Send row k at t as send number s (s = k in table order; with sessions the
    send sequence number): place it, then queue its tokenizer job, FIFO per
    server in send order, whose end is its engine arrival (keyed by s)."""
    requests, load, client, topology, ranks = run.requests, run.load, run.client, run.topology, run.ranks
    prefix_cache, out, router = run.prefix_cache, run.out, run.router
    rk, lp = state.rk, state.lp
    if lp.fail.shape[0] > 0 and not any_up_nb(
        lp.route, 0, topology.worker_role.shape[0] - topology.num_decode_workers
    ):  # failures: no worker takes it, the client's retry rule applies (docs/failures.md)
        lose_nb(k, t, False, run, state)
        return
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
        server = load.seq_tok_base[s] + client.tok_server[k]
    else:
        server = client.tok_server[k]
    end = max(t, lp.tok_free[server]) + client.tok_service_ns[k]
    lp.tok_free[server] = end
    lp.counts[ARR_SIZE] = heap_push_nb(lp.arr_key, lp.arr_val, lp.counts[ARR_SIZE], end, s)


@njit(cache=True, inline="always")
def _session_sends_nb(t, run, state):
    """(c) with sessions: the releases at t, then the sends they make (row order). Returns whether any happened."""
    load, send_ns, out = run.load, run.out.send_ns, run.out
    lp = state.lp
    send_size, sess_size, progressed = session_releases_nb(
        t, load.session_closed, load.session_think_ns, load.next_turn, load.turn_think_ns, load.session_first,
        lp.send_key, lp.send_val, lp.counts[SEND_SIZE], lp.sess_key, lp.sess_val, lp.counts[SESS_SIZE],
        lp.session_counters,
    )
    lp.counts[SEND_SIZE] = send_size
    while True:
        sess_size, k, s = session_next_send_nb(
            t, lp.sess_key, lp.sess_val, sess_size, lp.session_counters, send_ns, out.send_seq, lp.seq_row
        )
        if k < 0:
            break
        progressed = True
        _send_nb(k, s, t, run, state)
    lp.counts[SESS_SIZE] = sess_size
    return progressed


@njit(cache=True, inline="always")
def _table_sends_nb(t, run, state):
    """(b)+(c) the sends at t in table order (closed loop: as many as the send heap releases at t).
    Returns whether any happened."""
    requests, load, send_ns = run.requests, run.load, run.out.send_ns
    lp = state.lp
    n = requests.input_tokens.shape[0]
    send_size = lp.counts[SEND_SIZE]
    next_row = lp.counts[NEXT_ROW]
    progressed = False
    while next_row < n:
        if load.closed_loop:
            if send_size == 0 or lp.send_key[0] != t:
                break
            send_size = heap_pop_nb(lp.send_key, lp.send_val, send_size)
            send_ns[next_row] = t
        elif send_ns[next_row] != t:
            break
        k = next_row
        next_row += 1
        progressed = True
        lp.counts[SEND_SIZE] = send_size
        _send_nb(k, k, t, run, state)
        send_size = lp.counts[SEND_SIZE]  # failures: a send lost at once may end and release the next
    lp.counts[SEND_SIZE] = send_size
    lp.counts[NEXT_ROW] = next_row
    return progressed


@njit(cache=True, inline="always")
def _retry_sends_nb(t, run, state):
    """(b)+(c) with failures: the clients' retries at t, by row, after the table's sends. Returns whether any."""
    lp = state.lp
    progressed = False
    while True:
        k = retry_pop_nb(t, lp.fail, lp.retry_key, lp.retry_val)
        if k < 0:
            return progressed
        progressed = True
        _send_nb(k, run.out.send_seq[k] if run.load.session_mode else k, t, run, state)  # its first send number


@njit(cache=True, inline="always")
def _arrivals_nb(t, run, state):
    """(d) the engine arrivals at t, in send order; rejections end at once. Returns whether any happened."""
    load, topology, ranks, out = run.load, run.topology, run.ranks, run.out
    rk, lp = state.rk, state.lp
    arr_size = lp.counts[ARR_SIZE]
    progressed = False
    while arr_size > 0 and lp.arr_key[0] == t:
        k = lp.arr_val[0]
        if load.session_mode:  # keyed by send sequence number
            k = lp.seq_row[k]
        arr_size = heap_pop_nb(lp.arr_key, lp.arr_val, arr_size)
        progressed = True
        out.arrival_ns[k] = t
        if lp.routing:
            route_arrival_nb(lp.route, k, topology.worker_first_rank, topology.worker_num_ranks, rk.run_len,
                             rk.blocks_used, ranks.num_blocks, out.placed_rank)
        _enter_rank_nb(k, out.placed_rank[k], t, run, state)
    lp.counts[ARR_SIZE] = arr_size
    return progressed


@njit(cache=True, inline="always")
def _transfer_ends_nb(t, run, state):
    """(d) the KV-transfer ends at t, in handoff order: free the prefill blocks
    and enter the decode rank (h mod Wd, (h div Wd) mod Rd, or the one routed at
    the handoff). Returns whether any happened."""
    requests, topology, ranks, prefix_cache, out = run.requests, run.topology, run.ranks, run.prefix_cache, run.out
    rq, rk, lp = state.rq, state.rk, state.lp
    first_decode_worker = topology.worker_role.shape[0] - topology.num_decode_workers
    xfer_size = lp.counts[XFER_SIZE]
    progressed = False
    while xfer_size > 0 and lp.xfer_key[0] == t:
        h = lp.xfer_val[0]
        xfer_size = heap_pop_nb(lp.xfer_key, lp.xfer_val, xfer_size)
        progressed = True
        k = lp.handoff_req[h]
        if ranks.policy[out.placed_rank[k]] == POLICY_SGLANG and ranks.prefix_caching[out.placed_rank[k]]:
            radix_insert_nb(prefix_cache, out.placed_rank[k], ranks.num_blocks.shape[0], k, requests.input_tokens[k],
                            ranks.block_size[out.placed_rank[k]], rk.blocks_used)  # cache_finished_req
        _free_blocks_nb(prefix_cache, ranks, out.placed_rank[k], k, requests.input_tokens[k], rq.held, rk.blocks_used)
        out.transfer_end_ns[k] = t
        if lp.routing:
            g = handoff_rank_nb(lp.route, h)
        else:
            g = _decode_rank_nb(
                h, first_decode_worker, topology.num_decode_workers, topology.worker_first_rank,
                topology.worker_num_ranks,
            )
        rk.inflight[out.placed_rank[k]] -= 1
        rk.inflight[g] -= 1
        out.decode_rank[k] = g
        rq.computed[k] = requests.input_tokens[k] - 1
        _enter_rank_nb(k, g, t, run, state)
    lp.counts[XFER_SIZE] = xfer_size
    return progressed


@njit(cache=True, inline="always")
def _start_pass_nb(w, t, queue, run, state):
    """(e) Idle worker w starts a pass at t (``queue``: asynchronous, builds the
    one that starts when its running pass ends); preemptions alone retry at
    once (SPEC §5 (e)).  Returns ``OK``, ``BAD_TIMING`` or ``PASS_LOG_FULL``."""
    requests, topology, ranks, prefix_cache = run.requests, run.topology, run.ranks, run.prefix_cache
    timing, out, logs = run.timing, run.out, run.logs
    rq, rk, ps, lp = state.rq, state.rk, state.ps, state.lp
    record_passes = logs.pass_log.shape[0] > 0

    first_rank = topology.worker_first_rank[w]
    num_dp = topology.worker_num_ranks[w]
    slot = 1 - ps.run_slot[w] if queue else ps.run_slot[w]
    # the worker's pool's timing (docs/timing.md, Per-pool timing): its model and its span of the arrays
    model = timing.worker_model[w]
    span = timing.worker_span[w]
    params = timing.params[span[0]:span[1]]
    table = timing.table[span[2]:span[3]]
    while True:
        any_batch = False
        any_preempted = False
        worst_ms = 0.0
        for r in range(num_dp):
            g = first_rank + r
            if ranks.policy[g] == POLICY_SGLANG:
                preempted = build_sglang_batch_nb(g, t, requests, ranks, prefix_cache, out, rq, rk)
            elif ranks.policy[g] == POLICY_VLLM or ranks.policy[g] == POLICY_TRTLLM:
                preempted = build_vllm_batch_nb(
                    g, t, topology.worker_role[w] == ROLE_PREFILL, topology.worker_async[w], requests, ranks,
                    prefix_cache, out, rq, rk,
                )
            else:  # a code without a batch builder: an error, never another policy's batches
                raise ValueError("unknown scheduling policy code in Ranks.policy")
            batch_summary_nb(
                ps.summary, r, g, rk.running, rk.run_len, rq.sched_n, rq.computed, requests.input_tokens, out.generated,
                ranks.policy[g] == POLICY_SGLANG and rk.extend[g], topology.worker_role[w] == ROLE_DECODE, rq.drafts,
            )
            if topology.worker_async[w]:
                _enqueue_nb(g, slot, preempted, requests.input_tokens, out.generated, rq, rk)
            if ps.summary[r, 0] + ps.summary[r, 3] > 0:
                any_batch = True
            any_preempted = any_preempted or preempted
            if topology.worker_lockstep[w]:  # the ranks' times together, below
                ps.summary[r, 5] = rk.blocks_used[g]
                continue
            ms = rank_time_ms_nb(
                model,
                params,
                table,
                ps.summary[r, 0],
                ps.summary[r, 1],
                ps.summary[r, 2],
                ps.summary[r, 3],
                ps.summary[r, 4],
                ps.summary[r, 6],
                ps.summary[r, 7],
            )
            if ranks.spec_drafts[g] > 0:
                ms += spec_proposer_ms_nb(ranks.spec_proposer, g, ps.summary[r, 3])
            if not (ms >= 0.0 and ms < np.inf):
                _report_bad_batch_nb(logs.bad_batch, w, r, ps.summary, ms)
                return BAD_TIMING
            ps.rank_ms[r] = ms
            ps.summary[r, 5] = rk.blocks_used[g]
            if ms > worst_ms:
                worst_ms = ms
        if any_batch and topology.worker_lockstep[w]:  # expert parallelism: the ranks' times together
            worst_ms = lockstep_times_nb(model, params, table, ps.summary, num_dp, ps.rank_ms)
            if not (worst_ms >= 0.0 and worst_ms < np.inf):
                _report_bad_batch_nb(logs.bad_batch, w, 0, ps.summary, worst_ms)
                return BAD_TIMING
        if any_batch:
            if queue:  # it starts when the running pass ends
                ps.queued[w] = True
                ps.queued_ms[w] = worst_ms
                ps.queued_summary[w, :num_dp] = ps.summary[:num_dp]
                ps.queued_rank_ms[w, :num_dp] = ps.rank_ms[:num_dp]
                return OK
            end = t + max(np.int64(1), np.int64(np.rint(worst_ms * 1e6)))
            ps.pass_end[w] = end
            ps.pass_start[w] = t
            if record_passes:
                pass_log_rows = lp.counts[PASS_LOG_ROWS]
                if pass_log_rows + num_dp > logs.pass_log.shape[0]:
                    return PASS_LOG_FULL
                lp.counts[PASS_LOG_ROWS] = _log_pass_nb(
                    logs.pass_log, logs.pass_ms, pass_log_rows, w, num_dp, t, end, ps.summary, ps.rank_ms
                )
            return OK
        if not any_preempted:
            # Nothing schedulable: the worker stays idle (or nothing is queued).
            reset_ratio_if_idle_nb(
                first_rank, num_dp, topology.worker_role[w] == ROLE_DECODE, rk.wait_head, rk.inflight,
                rk.ratio, ranks.ratio_params,
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
def _enter_rank_nb(k, g, t, run, state):
    """Request k reaches rank g at t: rejected if its prompt reaches L, else waits.

    A rejection ends at the client at once: it releases a closed-loop send
    (after the think time) or, with sessions, the session's next turn, and
    the request leaves the router's counts.
    """
    requests, load, ranks, out = run.requests, run.load, run.ranks, run.out
    rq, rk, lp = state.rq, state.rk, state.lp
    if requests.input_tokens[k] >= ranks.seq_limit[g]:
        out.reject_ns[k] = t
        out.progress[0] += 1
        if load.closed_loop:
            lp.counts[SEND_SIZE] = heap_push_nb(lp.send_key, lp.send_val, lp.counts[SEND_SIZE], t + load.think_ns, 0)
        if lp.routing:
            route_prompt_done_nb(lp.route, k, requests.input_tokens[k])
            route_leave_nb(lp.route, k, g)
        if load.session_mode:
            lp.counts[SEND_SIZE] = heap_push_nb(lp.send_key, lp.send_val, lp.counts[SEND_SIZE], t, k)
    elif ranks.queue_order[g] == ORDER_FCFS or ranks.queue_order[g] >= ORDER_RANDOM:  # at the back
        wait_push_back_nb(rk.wait_head, rk.wait_tail, rq.wait_next, rq.wait_prev, g, k)
    else:  # a keyed order (docs/semantics.md): its place by key, then entry instant or insertion
        rq.queued_ns[k] = t
        wait_insert_nb(rk.wait_head, rk.wait_tail, rq.wait_next, rq.wait_prev, g, k, ranks.queue_order[g],
                       requests.queue_key, rq.queued_ns)


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
def _enqueue_nb(g, slot, preempted, input_tokens, generated, rq, rk):
    """Asynchronous scheduling: rank g's just-built batch goes into sample slot ``slot``.

    The scheduled tokens count as computed at once (the next build follows them
    without waiting for this pass); a chunk that reaches the request's known
    tokens samples a token, planned until its pass ends.  After a preemption
    every waiting request's in-flight output is dropped (a preempted request
    recomputes and samples again after resumption; the others have none).
    """
    running, run_len, wait_head = rk.running, rk.run_len, rk.wait_head
    sched_n, computed, planned = rq.sched_n, rq.computed, rq.planned
    sample_flag, wait_next = rq.sample_flag, rq.wait_next
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
