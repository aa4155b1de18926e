"""Scheduler kernels: one rank's batch for each policy (SPEC §5, docs/policies.md).

Contract: ``@njit(cache=True)`` functions over the engine kernel's flat state
arrays (``simcore.engine.nb``): per-request token counts and block holdings,
per-rank running arrays, waiting queues (doubly linked lists through
per-request links) and KV block counts.  A builder sets ``sched_n`` (tokens
scheduled per request) and returns whether it preempted (or retracted) a
request; ``batch_summary_nb`` then reads the SPEC §8 batch summary off it.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from simcore.scheduler.gencache_nb import cache_generated_on_release_nb
from simcore.scheduler.dfs_weight_nb import sort_dfs_weight_nb
from simcore.scheduler.kv_nb import HDR_OFFSET, kv_allocate_nb
from simcore.scheduler.kv_tree_nb import prefix_hits_nb, prefix_register_nb, prefix_release_nb, prefix_take_hits_nb
from simcore.scheduler.radix_ident_nb import ident_at_nb
from simcore.scheduler.radix_nb import radix_insert_nb, radix_lock_nb, radix_match_nb, radix_release_nb
from simcore.scheduler.spec_nb import GOLDEN, UNIT, _mix_nb, spec_proposes_nb, spec_query_nb
from simcore.scheduler.offload_nb import (
    BLOCKED,
    PROCEED,
    offload_admission_nb,
    offload_enabled_nb,
    offload_store_batch_nb,
)

POLICY_VLLM = 0
POLICY_SGLANG = 1
POLICY_TRTLLM = 2

# Waiting-queue orders (``Ranks.queue_order``; simcore.scheduler.policies.ORDER_*, docs/semantics.md):
# arrival order; a key, then the instant the request entered the rank (vLLM's heap,
# request_queue.py PriorityRequestQueue); a key, then insertion order (SGLang's stable
# sort of its waiting list, schedule_policy.py SchedulePolicy.calc_priority).
ORDER_FCFS = 0
ORDER_KEY_INSTANT = 1
ORDER_KEY_STABLE = 2
ORDER_RANDOM = 3  # arrival order, shuffled before each extend batch (SGLang's random.shuffle)
ORDER_LPM = 4  # arrival order, sorted by the radix cache's match before each extend batch (SGLang's lpm)
ORDER_DFS_WEIGHT = 5  # arrival order, walked depth first in the radix tree before each extend batch (dfs-weight)
# Orders >= ORDER_RANDOM put a request at the back, as FCFS, and reorder at the batch build.

# SGLang lpm (schedule_policy.py, commit 00550cd): SchedulePolicy._determine_active_policy
# runs FCFS when more than 128 requests wait; _compute_prefix_matches checks a request
# whose cache match is at most IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD (32) tokens
# against the waiting requests before it, and puts it last when they share at least
# IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD (32) tokens.
LPM_MAX_WAITING = 128
IN_BATCH_CHECK_TOKENS = 32
IN_BATCH_DEPRIORITIZE_TOKENS = 32
LPM_DEPRIORITIZED = 1 << 62  # the sort key of a deprioritised request (SGLang's float("inf"))

# SGLang constants (python/sglang/srt/managers/schedule_policy.py, scheduler.py).
CLIP_MAX_NEW_TOKENS = 4096
RETRACT_DECODE_STEPS = 20


# ------------------------------------------------------------------ waiting queues
# One doubly linked list per rank through per-request next/prev links (a request
# waits on at most one rank), so pushes at either end and pops are O(1).


@njit(cache=True)
def wait_push_back_nb(head, tail, nxt, prv, g, k):
    """Append request k to rank g's waiting queue.

    Parameters
    ----------
    head, tail : ndarray(int64, ndim=1)
        Per rank, first and last waiting request (-1: empty); updated.
    nxt, prv : ndarray(int64, ndim=1)
        Per request, next and previous links (-1: none); updated.
    g : int
        Global rank.
    k : int
        Request index.
    """
    nxt[k] = -1
    prv[k] = tail[g]
    if tail[g] >= 0:
        nxt[tail[g]] = k
    else:
        head[g] = k
    tail[g] = k


@njit(cache=True)
def _wait_push_front_nb(head, tail, nxt, prv, g, k):
    prv[k] = -1
    nxt[k] = head[g]
    if head[g] >= 0:
        prv[head[g]] = k
    else:
        tail[g] = k
    head[g] = k


@njit(cache=True)
def _wait_unlink_nb(head, tail, nxt, prv, g, k):
    """Take request k out of rank g's waiting queue, wherever it is."""
    if prv[k] >= 0:
        nxt[prv[k]] = nxt[k]
    else:
        head[g] = nxt[k]
    if nxt[k] >= 0:
        prv[nxt[k]] = prv[k]
    else:
        tail[g] = prv[k]


@njit(cache=True)
def _wait_pop_front_nb(head, tail, nxt, prv, g):
    k = head[g]
    head[g] = nxt[k]
    if head[g] >= 0:
        prv[head[g]] = -1
    else:
        tail[g] = -1
    return k


@njit(cache=True)
def _precedes_nb(a, b, order, queue_key, queued_ns):
    """Whether request a goes before request b in a keyed waiting queue (lower key first;
    on equal keys the earlier entry instant under ``ORDER_KEY_INSTANT``)."""
    if queue_key[a] != queue_key[b]:
        return queue_key[a] < queue_key[b]
    return order == ORDER_KEY_INSTANT and queued_ns[a] < queued_ns[b]


@njit(cache=True)
def wait_insert_nb(head, tail, nxt, prv, g, k, order, queue_key, queued_ns):
    """Put request k into rank g's waiting queue in its keyed order.

    It goes after every waiting request it does not precede
    (:func:`_precedes_nb`), so requests that tie keep their insertion order.
    The walk starts at the tail: a request of the lowest class costs O(1).

    Parameters
    ----------
    head, tail : ndarray(int64, ndim=1)
        Per rank, first and last waiting request (-1: empty); updated.
    nxt, prv : ndarray(int64, ndim=1)
        Per request, next and previous links (-1: none); updated.
    g : int
        Global rank.
    k : int
        Request index.
    order : int
        ``ORDER_KEY_INSTANT`` or ``ORDER_KEY_STABLE``.
    queue_key : ndarray(int64, ndim=1)
        Per request, the order's key (lower first).
    queued_ns : ndarray(int64, ndim=1)
        Per request, the instant it entered its rank, ns.
    """
    j = tail[g]
    while j >= 0 and _precedes_nb(k, j, order, queue_key, queued_ns):
        j = prv[j]
    if j < 0:
        _wait_push_front_nb(head, tail, nxt, prv, g, k)
        return
    after = nxt[j]
    prv[k] = j
    nxt[k] = after
    nxt[j] = k
    if after >= 0:
        prv[after] = k
    else:
        tail[g] = k


@njit(cache=True)
def shuffle_uniform_nb(key, g, shuffle, i):
    """The uniform in [0, 1) of position ``i`` of rank ``g``'s shuffle number ``shuffle``.

    Parameters
    ----------
    key : int
        The run's shuffle key, in [0, 2**63).
    g : int
        Global rank.
    shuffle : int
        The rank's shuffles before this one.
    i : int
        The Fisher-Yates position.

    Returns
    -------
    float
        ``(h >> 11) * 2**-53`` with ``h = mix(mix(mix(key + g * G) + shuffle * G) + i * G)``, G the
        golden-ratio constant (SplitMix64's finaliser, as the speculative draws).
    """
    x = _mix_nb(np.uint64(key) + np.uint64(g) * GOLDEN)
    x = _mix_nb(x + np.uint64(shuffle) * GOLDEN)
    x = _mix_nb(x + np.uint64(i) * GOLDEN)
    return np.float64(x >> np.uint64(11)) * UNIT


@njit(cache=True)
def _shuffle_waiting_nb(g, head, tail, nxt, prv, buf, key, shuffles):
    """SGLang ``random``: shuffle rank g's waiting queue (Fisher-Yates as Python's
    ``random.shuffle``: for i from the last position down to 1, swap i with
    ``floor(u * (i + 1))``), u from :func:`shuffle_uniform_nb`."""
    m = 0
    k = head[g]
    while k >= 0:
        buf[m] = k
        m += 1
        k = nxt[k]
    c = shuffles[g]
    shuffles[g] = c + 1
    for i in range(m - 1, 0, -1):
        j = np.int64(shuffle_uniform_nb(key, g, c, i) * (i + 1))
        tmp = buf[i]
        buf[i] = buf[j]
        buf[j] = tmp
    head[g] = buf[0]
    tail[g] = buf[m - 1]
    for i in range(m):
        prv[buf[i]] = buf[i - 1] if i > 0 else -1
        nxt[buf[i]] = buf[i + 1] if i + 1 < m else -1


@njit(cache=True)
def _sort_lpm_nb(pc, g, num_ranks, block_size, blocks_used, input_tokens, generated, head, tail, nxt, prv):
    """SGLang ``lpm`` (``SchedulePolicy.calc_priority``): sort rank g's waiting queue, stably,
    by the radix cache's match, longest first, a request sharing a prefix with one before it
    last; left as it is when more than ``LPM_MAX_WAITING`` requests wait.

    Every waiting request is matched in queue order (``radix_match_nb``: the match
    refreshes the path's access stamps, as SGLang's ``match_prefix`` does).  A request whose
    match covers at most ``IN_BATCH_CHECK_TOKENS`` tokens is compared with the earlier such
    requests not put last: it is put last if it shares its first
    ``ceil(IN_BATCH_DEPRIORITIZE_TOKENS / block_size)`` block identities with one of them,
    else it joins them (SGLang's waiting-queue radix tree).
    """
    n = 0
    k = head[g]
    while k >= 0:
        n += 1
        if n > LPM_MAX_WAITING:
            return
        k = nxt[k]
    buf = np.empty(n, dtype=np.int64)
    key = np.empty(n, dtype=np.int64)
    probe = np.empty(n, dtype=np.int64)  # per request checked in-batch: its identity at depth m - 1
    kept = np.empty(n, dtype=np.int64)  # the positions that joined the waiting-queue tree
    s = pc[0]
    ident = pc[1]
    m = (IN_BATCH_DEPRIORITIZE_TOKENS + block_size - 1) // block_size
    kept_n = 0
    k = head[g]
    for i in range(n):
        buf[i] = k
        k = nxt[k]
    for i in range(n):
        k = buf[i]
        hits, _ = radix_match_nb(pc, g, num_ranks, k, input_tokens[k] + generated[k], block_size, blocks_used)
        key[i] = -hits * block_size
        if hits * block_size > IN_BATCH_CHECK_TOKENS:
            continue
        first = s[s[HDR_OFFSET] + k]
        probe[i] = -1
        if s[s[HDR_OFFSET] + k + 1] - first >= m:
            probe[i] = ident_at_nb(ident, k, first + m - 1)
        shared = False
        if probe[i] >= 0:
            for q in range(kept_n):
                j = kept[q]
                if probe[j] != probe[i]:
                    continue
                a = buf[j]
                other = s[s[HDR_OFFSET] + a]
                same = True
                for b in range(m - 1):
                    if ident_at_nb(ident, a, other + b) != ident_at_nb(ident, k, first + b):
                        same = False
                        break
                if same:
                    shared = True
                    break
        if shared:
            key[i] = LPM_DEPRIORITIZED
        else:
            kept[kept_n] = i
            kept_n += 1
    # list.sort is stable: insertion sort of the positions by key
    order = np.arange(n)
    for i in range(1, n):
        p = order[i]
        j = i - 1
        while j >= 0 and key[order[j]] > key[p]:
            order[j + 1] = order[j]
            j -= 1
        order[j + 1] = p
    head[g] = buf[order[0]]
    tail[g] = buf[order[n - 1]]
    for i in range(n):
        k = buf[order[i]]
        prv[k] = buf[order[i - 1]] if i > 0 else -1
        nxt[k] = buf[order[i + 1]] if i + 1 < n else -1


@njit(cache=True)
def _lowest_priority_nb(running, run_len, g, queue_key, queued_ns):
    """Index in ``running[g]`` of vLLM's priority victim: the largest (key, entry instant), the
    first such in running order (``max(self.running, key=lambda r: (r.priority, r.arrival_time))``)."""
    worst = 0
    for j in range(1, run_len[g]):
        a = running[g, j]
        b = running[g, worst]
        if queue_key[a] > queue_key[b] or (queue_key[a] == queue_key[b] and queued_ns[a] > queued_ns[b]):
            worst = j
    return worst


@njit(cache=True)
def _blocks_for_nb(tokens, block_size):
    return (tokens + block_size - 1) // block_size


@njit(cache=True)
def _grow_nb(tokens, held, block_size):
    """Blocks to add so that ``held`` blocks cover ``tokens`` (no division in
    the common case of a decode step inside the last block)."""
    spare = held * block_size - tokens
    if spare >= 0:
        return 0
    return (block_size - 1 - spare) // block_size


@njit(cache=True, inline="always")
def build_vllm_batch_nb(g, t, prefill_role, asynchronous, requests, ranks, pc, out, rq, rk):
    """Build rank g's batch with the vLLM policy (SPEC §5); returns whether it preempted.

    With the TensorRT-LLM policy (``no_evict``: GUARANTEED_NO_EVICT), a waiting
    request is admitted only if its blocks to completion fit beside every
    running request's reservation to completion; then allocations never fail.
    With prefix caching (docs/prefix-caching.md) an admission first reuses the
    request's longest resident prompt prefix.  Under asynchronous scheduling
    (docs/semantics.md) ``planned`` also counts the output tokens in flight and
    ``computed`` the tokens already scheduled; a running request whose every
    output is planned is skipped.  Inlined into the event loop (its one
    caller): a call would count references on every member of the tuples.

    Parameters
    ----------
    g : int
        Global rank.
    t : int
        Pass start, ns (stamped as a first admission).
    prefill_role : bool
        The rank is in the P/D prefill pool (reserves the prompt only).
    asynchronous : bool
        Asynchronous scheduling on this rank's worker (docs/semantics.md).
    requests, ranks : Requests, Ranks
        Prompt and output lengths (tokens); per rank the token budget, sequences,
        KV blocks, block size, sequence limit L, policy, prefix caching and
        ``reserve_full_isl`` (vLLM's ``scheduler_reserve_full_isl``: a waiting
        request is admitted only if the blocks of all its known tokens fit) and
        ``chunked_prefill`` (false: vLLM's ``--no-enable-chunked-prefill``, a
        waiting request whose tokens to compute exceed the budget left ends
        the waiting loop: it keeps its place and nothing behind it is admitted).
    pc : tuple of ndarray(int64, ndim=1)
        The prefix-cache state (``simcore.scheduler.kv_nb``); updated.
    out : Outputs
        ``first_admit_ns`` (set to ``t`` at the first admission, with
        ``cached_tokens``) and ``num_preemptions``; updated.
    rq, rk : RequestState, RankState
        The event loop's per-request and per-rank state: ``planned`` and
        ``computed`` read, ``held``, the waiting queues, ``running``,
        ``run_len`` and ``blocks_used`` updated, ``sched_n`` set for this pass.
    (The NamedTuples of ``simcore.engine.state``.)

    Returns
    -------
    bool
        Whether a running request was preempted.
    """
    input_tokens = requests.input_tokens
    output_tokens = requests.output_tokens
    rank_max_batched_tokens = ranks.max_batched_tokens
    rank_max_sequences = ranks.max_sequences
    rank_num_blocks = ranks.num_blocks
    rank_block_size = ranks.block_size
    rank_seq_limit = ranks.seq_limit
    no_evict = ranks.policy[g] == POLICY_TRTLLM
    caching = ranks.prefix_caching[g]
    reserve_full = ranks.reserve_full_isl[g]
    chunking = ranks.chunked_prefill[g]
    spec_drafts = ranks.spec_drafts[g]
    lookahead = ranks.spec_lookahead[g]
    drafts = rq.drafts
    order = ranks.queue_order[g]
    preempt_lowest = ranks.preempt_lowest[g]
    queue_key = requests.queue_key
    queued_ns = rq.queued_ns
    first_admit_ns = out.first_admit_ns
    num_preemptions = out.num_preemptions
    cached_tokens = out.cached_tokens
    planned = rq.planned
    computed = rq.computed
    held = rq.held
    sched_n = rq.sched_n
    wait_next = rq.wait_next
    wait_prev = rq.wait_prev
    wait_head = rk.wait_head
    wait_tail = rk.wait_tail
    running = rk.running
    run_len = rk.run_len
    blocks_used = rk.blocks_used
    num_ranks = rank_num_blocks.shape[0]
    budget = rank_max_batched_tokens[g]
    block_size = rank_block_size[g]
    num_blocks = rank_num_blocks[g]
    preempted = False
    # Step 1: running requests in running order.
    i = 0
    while i < run_len[g]:
        k = running[g, i]
        if asynchronous and (planned[k] >= output_tokens[k] or input_tokens[k] + planned[k] >= rank_seq_limit[g]):
            i += 1  # its last token is in flight: it leaves when that pass ends
            continue
        n_tok = min(input_tokens[k] + planned[k] - computed[k], budget)
        if n_tok == 0:
            break
        slots = computed[k] + n_tok
        if spec_drafts > 0:  # a decode step verifies its proposals; lookahead slots for the proposer
            if n_tok == 1:
                n_tok = min(spec_query_nb(spec_drafts, planned[k], computed[k], input_tokens[k] + planned[k],
                                          rank_seq_limit[g]), budget)
                if n_tok > 1 and not spec_proposes_nb(ranks, g, k, requests.token_offset[k], planned[k],
                                                      requests.spec_stream):
                    n_tok = 1  # vLLM n-gram: no match, no proposals; a plain decode step
            slots = min(computed[k] + n_tok + lookahead, rank_seq_limit[g])
        grow = _grow_nb(slots, held[k], block_size)
        self_preempted = False
        while grow > num_blocks - blocks_used[g]:
            if preempt_lowest:  # vLLM priority: the lowest-priority running request, wherever it is
                worst = _lowest_priority_nb(running, run_len, g, queue_key, queued_ns)
                victim = running[g, worst]
                for j in range(worst, run_len[g] - 1):
                    running[g, j] = running[g, j + 1]
                run_len[g] -= 1
                if worst < i:  # scheduled earlier in this pass: its tokens go back to the budget
                    budget += sched_n[victim]
                    sched_n[victim] = 0
                    drafts[victim] = 0
                    i -= 1
            else:
                run_len[g] -= 1
                victim = running[g, run_len[g]]
            in_flight = planned[victim] - out.generated[victim]  # an output its running-pass entry samples
            cache_generated_on_release_nb(pc, ranks, g, victim, computed[victim] - in_flight, blocks_used)
            prefix_release_nb(pc, g, victim, held, blocks_used)
            computed[victim] = 0
            num_preemptions[victim] += 1
            if order == ORDER_FCFS:
                _wait_push_front_nb(wait_head, wait_tail, wait_next, wait_prev, g, victim)
            else:
                wait_insert_nb(wait_head, wait_tail, wait_next, wait_prev, g, victim, order, queue_key, queued_ns)
            preempted = True
            if victim == k:
                self_preempted = True
                break
        if self_preempted:
            break
        if grow > 0:
            kv_allocate_nb(pc, g, grow, blocks_used, num_blocks)
            held[k] += grow
        if caching and computed[k] < input_tokens[k]:  # else every prompt block is registered already
            reusable = _reusable_nb(no_evict, computed[k] + n_tok, input_tokens[k])
            prefix_register_nb(pc, g, num_ranks, k, reusable, block_size, blocks_used)
        sched_n[k] = n_tok
        if spec_drafts > 0 and n_tok > 1 and computed[k] == input_tokens[k] + planned[k] - 1:
            drafts[k] = n_tok - 1
        budget -= n_tok
        i += 1
    offload = caching and offload_enabled_nb(pc, g)
    first_admitted = run_len[g]
    if preempted:
        if offload:
            offload_store_batch_nb(pc, g, num_ranks, running, run_len, first_admitted, sched_n, computed,
                                   num_preemptions, block_size)
        return True
    # Blocks still promised to running requests until they complete (no-evict).
    promised = 0
    if no_evict:
        for i in range(run_len[g]):
            k = running[g, i]
            promised += _footprint_nb(k, input_tokens, output_tokens, rank_seq_limit[g], block_size, prefill_role,
                                      spec_drafts + lookahead) - held[k]
    # Step 2: waiting requests, FIFO, with head-of-line blocking.
    # With a CPU tier, requests loading their KV stay queued and are passed over;
    # with chunked prefill off, a whole need over the budget left ends the step.
    k = wait_head[g]
    while k >= 0 and run_len[g] < rank_max_sequences[g] and budget > 0:
        known = input_tokens[k] + planned[k]
        hits = 0
        cached_hits = 0
        if offload:
            code, hits, cached_hits = offload_admission_nb(
                pc, g, num_ranks, k, t, known, block_size, num_blocks, rank_max_sequences[g], blocks_used, held,
                computed, first_admit_ns[k] < 0,
            )
            if code == BLOCKED:
                break
            if code != PROCEED:
                k = wait_next[k]
                continue
        elif caching:
            hits, cached_hits = prefix_hits_nb(pc, g, num_ranks, k, known, block_size, blocks_used)
        fresh = computed[k] == 0  # else a P/D decode entrant (input - 1) or a loaded request
        start = hits * block_size if caching and fresh else computed[k]
        if not chunking and known - start > budget:
            break  # vLLM: the waiting loop stops here, no chunk (docs/semantics.md)
        n_tok = min(known - start, budget)
        slots = start + n_tok
        if lookahead > 0 and not fresh:  # vLLM: lookahead slots unless num_computed_tokens == 0
            slots = min(slots + lookahead, rank_seq_limit[g])
        grow = _grow_nb(slots, held[k] + hits, block_size)
        must_fit = grow
        if reserve_full:  # the whole sequence, not only the chunk scheduled now
            must_fit = max(grow, _grow_nb(known, held[k] + hits, block_size))
        if must_fit + cached_hits > num_blocks - blocks_used[g]:
            break
        if no_evict:
            footprint = _footprint_nb(k, input_tokens, output_tokens, rank_seq_limit[g], block_size, prefill_role,
                                      spec_drafts + lookahead)
            if footprint > num_blocks - blocks_used[g] - promised:
                break
            promised += footprint - grow - hits
        following = wait_next[k]
        _wait_unlink_nb(wait_head, wait_tail, wait_next, wait_prev, g, k)
        running[g, run_len[g]] = k
        run_len[g] += 1
        if caching and fresh:
            prefix_take_hits_nb(pc, g, k, hits, blocks_used)
            computed[k] = hits * block_size
            held[k] = hits
        kv_allocate_nb(pc, g, grow, blocks_used, num_blocks)
        held[k] += grow
        if caching:
            reusable = _reusable_nb(no_evict, computed[k] + n_tok, input_tokens[k])
            prefix_register_nb(pc, g, num_ranks, k, reusable, block_size, blocks_used)
        if first_admit_ns[k] < 0:
            first_admit_ns[k] = t
            cached_tokens[k] = computed[k]
        sched_n[k] = n_tok
        budget -= n_tok
        k = following
    if offload:
        offload_store_batch_nb(pc, g, num_ranks, running, run_len, first_admitted, sched_n, computed,
                               num_preemptions, block_size)
    return False


@njit(cache=True)
def _reusable_nb(trtllm, tokens, input_tokens):
    """Tokens whose complete prompt blocks become reusable once ``tokens`` are
    scheduled: all of them in vLLM; in TensorRT-LLM none before the last
    context chunk, then the first ``input - 1`` (``storeContextBlocks``)."""
    if not trtllm:
        return tokens
    if tokens < input_tokens:
        return 0
    return input_tokens - 1


@njit(cache=True)
def _footprint_nb(k, input_tokens, output_tokens, seq_limit, block_size, prefill_role, spec_slots):
    """Blocks request k holds at most until it completes on this rank (no-evict).

    A prefill-role rank keeps only the prompt; elsewhere the prompt plus every
    requested output token, capped at the sequence limit L.  With speculative
    decoding (``spec_slots``: proposals plus lookahead slots per step) the last
    step also holds its proposals: ``spec_slots - 1`` more tokens.
    """
    if prefill_role:
        return _blocks_for_nb(input_tokens[k], block_size)
    return _blocks_for_nb(min(input_tokens[k] + output_tokens[k] + max(spec_slots - 1, 0), seq_limit), block_size)


@njit(cache=True)
def _ceil_page_nb(tokens, block_size):
    return _blocks_for_nb(tokens, block_size) * block_size


@njit(cache=True, inline="always")
def build_sglang_batch_nb(g, t, requests, ranks, pc, out, rq, rk):
    """Build rank g's batch with the SGLang policy (docs/policies.md); returns
    whether it retracted a request.

    Prefill first: an extend batch (the chunked request, then waiting requests
    within the token budgets) if anything can be admitted; otherwise a decode
    batch of every running request but the chunked one, retracting the
    requests with the fewest generated tokens while the step's KV does not fit.
    Inlined into the event loop (its one caller), as ``build_vllm_batch_nb``.

    Parameters
    ----------
    g : int
        Global rank.
    t : int
        Pass start, ns (stamped as a first admission).
    requests, ranks : Requests, Ranks
        Prompt and output lengths (tokens); per rank the sequences, KV blocks,
        block size, chunked-prefill and extend-batch budgets (tokens),
        ``ratio_params`` ``[init, min, decay]`` of new_token_ratio and whether
        the radix cache (``simcore.scheduler.radix_nb``) is on.
    pc : tuple of ndarray(int64, ndim=1)
        The prefix-cache state; updated.
    out : Outputs
        ``generated`` read; ``first_admit_ns`` (set to ``t`` at the first
        admission, with ``cached_tokens``) and ``num_preemptions`` updated.
    rq, rk : RequestState, RankState
        The event loop's per-request and per-rank state: ``computed``,
        ``held``, the waiting queues, ``running``, ``run_len``,
        ``blocks_used``, the rank's new_token_ratio (``ratio``) and chunked
        request (``chunked``, SGLang's ``Scheduler.chunked_req``, -1: none)
        updated; ``sched_n`` and ``extend`` (the batch is an extend batch) set.
    (The NamedTuples of ``simcore.engine.state``.)

    Returns
    -------
    bool
        Whether a running request was retracted.
    """
    input_tokens = requests.input_tokens
    output_tokens = requests.output_tokens
    rank_max_sequences = ranks.max_sequences
    rank_num_blocks = ranks.num_blocks
    rank_block_size = ranks.block_size
    rank_chunk_tokens = ranks.chunk_tokens
    rank_max_prefill_tokens = ranks.max_prefill_tokens
    ratio_params = ranks.ratio_params
    caching = ranks.prefix_caching[g]
    generated = out.generated
    first_admit_ns = out.first_admit_ns
    num_preemptions = out.num_preemptions
    cached_tokens = out.cached_tokens
    computed = rq.computed
    held = rq.held
    sched_n = rq.sched_n
    wait_next = rq.wait_next
    wait_prev = rq.wait_prev
    wait_head = rk.wait_head
    wait_tail = rk.wait_tail
    running = rk.running
    run_len = rk.run_len
    blocks_used = rk.blocks_used
    rank_ratio = rk.ratio
    rank_chunked = rk.chunked
    rank_extend = rk.extend
    block_size = rank_block_size[g]
    num_blocks = rank_num_blocks[g]
    num_ranks = rank_num_blocks.shape[0]
    empty_rank = run_len[g] == 0
    ratio = rank_ratio[g]
    chunked = rank_chunked[g]
    if caching and chunked >= 0:
        # cache_unfinished_req at the round's start: the chunks so far join the tree.
        radix_insert_nb(pc, g, num_ranks, chunked, computed[chunked], block_size, blocks_used)
    # PrefillAdder: rem_total = free tokens - offset, evaluated at each use; the
    # offset starts as the sum of the decoding requests' reservations, in
    # running order, and grows by each admission's charge.
    free_tokens = (num_blocks - blocks_used[g]) * block_size
    offset = 0.0
    for i in range(run_len[g]):
        k = running[g, i]
        if k != chunked:
            offset += min(output_tokens[k] - generated[k], CLIP_MAX_NEW_TOKENS) * ratio
    rem_input = rank_max_prefill_tokens[g]
    rem_chunk = rank_chunk_tokens[g]
    scheduled = 0
    if ranks.queue_order[g] == ORDER_RANDOM and wait_head[g] >= 0 and run_len[g] < rank_max_sequences[g]:
        # SchedulePolicy.calc_priority: random.shuffle(waiting_queue) before each extend batch
        _shuffle_waiting_nb(g, wait_head, wait_tail, wait_next, wait_prev, rq.shuffle_buf, ranks.shuffle_key[g],
                            rk.shuffles)
    if ranks.queue_order[g] == ORDER_LPM and wait_head[g] >= 0 and run_len[g] < rank_max_sequences[g]:
        # SchedulePolicy.calc_priority: sorted by the prefix match before each extend batch
        _sort_lpm_nb(pc, g, num_ranks, block_size, blocks_used, input_tokens, generated, wait_head, wait_tail,
                     wait_next, wait_prev)
    if ranks.queue_order[g] == ORDER_DFS_WEIGHT and wait_head[g] >= 0 and run_len[g] < rank_max_sequences[g]:
        # SchedulePolicy.calc_priority: _sort_by_dfs_weight before each extend batch (no length cut-off)
        sort_dfs_weight_nb(pc, g, num_ranks, block_size, blocks_used, input_tokens, generated, wait_head, wait_tail,
                           wait_next, wait_prev)
    if chunked >= 0:
        k = chunked
        need = input_tokens[k] + generated[k] - computed[k]
        limit = min(rem_chunk, int(free_tokens - offset))
        if limit <= 0:
            limit = rem_chunk  # it must run: SGLang falls back to the chunk budget
        n_tok = min(need, limit)
        grow = _grow_nb(computed[k] + n_tok, held[k], block_size)
        if grow <= num_blocks - blocks_used[g]:
            kv_allocate_nb(pc, g, grow, blocks_used, num_blocks)
            held[k] += grow
            sched_n[k] = n_tok
            scheduled += 1
            reserve = 0
            if n_tok == need:
                reserve = min(output_tokens[k], CLIP_MAX_NEW_TOKENS)
                rank_chunked[g] = -1  # its last chunk: it decodes from the next pass
            charge = _ceil_page_nb(n_tok, block_size)
            offset += charge + reserve  # one int, added at once as in SGLang
            rem_input -= charge
            rem_chunk -= charge
    while wait_head[g] >= 0 and run_len[g] < rank_max_sequences[g]:
        k = wait_head[g]
        start = computed[k]  # 0, or input - 1 for a P/D decode entrant
        hits = 0
        cached_hits = 0
        if caching:
            hits, cached_hits = radix_match_nb(pc, g, num_ranks, k, input_tokens[k] + generated[k], block_size,
                                               blocks_used)
            start = hits * block_size
        # Locking the matched prefix takes its unlocked blocks out of the free tokens.
        locked_free = free_tokens - cached_hits * block_size
        need = input_tokens[k] + generated[k] - start
        # On an empty rank the first request only needs its blocks to fit: a
        # request whose reservation exceeds the pool would otherwise wait forever.
        if (need + min(output_tokens[k] - generated[k], CLIP_MAX_NEW_TOKENS) >= locked_free - offset
                and not (empty_rank and scheduled == 0)):
            break
        paged = _ceil_page_nb(need, block_size)
        if paged >= rem_input and scheduled > 0:
            break
        n_tok = need
        reserve = min(output_tokens[k], CLIP_MAX_NEW_TOKENS)
        if paged > rem_chunk:
            n_tok = (rem_chunk // block_size) * block_size  # page-aligned chunk
            reserve = 0
            # One chunked request per rank: none while a skipped one is pending.
            if n_tok <= 0 or rank_chunked[g] >= 0:
                break
        grow = _grow_nb(start + n_tok, held[k] + hits, block_size)
        if grow + cached_hits > num_blocks - blocks_used[g]:
            break
        _wait_pop_front_nb(wait_head, wait_tail, wait_next, wait_prev, g)
        running[g, run_len[g]] = k
        run_len[g] += 1
        if caching:
            radix_lock_nb(pc, g, k, hits, blocks_used)
            computed[k] = start
            held[k] = hits
            free_tokens = locked_free
        kv_allocate_nb(pc, g, grow, blocks_used, num_blocks)
        held[k] += grow
        if first_admit_ns[k] < 0:
            first_admit_ns[k] = t
            cached_tokens[k] = hits * block_size
        sched_n[k] = n_tok
        scheduled += 1
        charge = _ceil_page_nb(n_tok, block_size)
        offset += charge + reserve
        rem_input -= charge
        rem_chunk -= charge
        if n_tok < need:
            rank_chunked[g] = k
            break  # a chunked admission closes the extend batch
        if free_tokens - offset <= 0 or rem_input <= 0 or rem_chunk <= 0:
            break
    rank_extend[g] = scheduled > 0
    if scheduled > 0:
        return False

    # Decode batch: every running request but the chunked one (with its proposals).
    spec_drafts = ranks.spec_drafts[g]
    seq_limit = ranks.seq_limit[g]
    needed = 0
    decoders = 0
    for i in range(run_len[g]):
        k = running[g, i]
        if k != chunked:
            decoders += 1
            q = spec_query_nb(spec_drafts, generated[k], computed[k], input_tokens[k] + generated[k], seq_limit)
            needed += _grow_nb(computed[k] + q, held[k], block_size)
    retracted = False
    while needed > num_blocks - blocks_used[g] and decoders > 1:
        # Victim: fewest generated tokens, then the longest prompt, then the latest.
        victim_i = -1
        for i in range(run_len[g]):
            k = running[g, i]
            if k == chunked:
                continue
            if victim_i < 0:
                victim_i = i
                continue
            v = running[g, victim_i]
            if generated[k] < generated[v] or (
                generated[k] == generated[v] and input_tokens[k] >= input_tokens[v]
            ):
                victim_i = i
        v = running[g, victim_i]
        q = spec_query_nb(spec_drafts, generated[v], computed[v], input_tokens[v] + generated[v], seq_limit)
        needed -= _grow_nb(computed[v] + q, held[v], block_size)
        _retract_nb(g, victim_i, running, run_len, blocks_used, held, computed,
                    num_preemptions, wait_head, wait_tail, wait_next, wait_prev, pc,
                    ranks.queue_order[g], requests.queue_key, rq.queued_ns)
        decoders -= 1
        retracted = True
    if needed > num_blocks - blocks_used[g] and chunked >= 0:
        # Still short with one decoder left: the chunked request, skipped above
        # because its chunk did not fit, holds the missing blocks.
        for i in range(run_len[g]):
            if running[g, i] == chunked:
                _retract_nb(g, i, running, run_len, blocks_used, held, computed,
                            num_preemptions, wait_head, wait_tail, wait_next, wait_prev, pc,
                            ranks.queue_order[g], requests.queue_key, rq.queued_ns)
                break
        chunked = -1
        rank_chunked[g] = -1
        retracted = True
    if retracted:
        decoded = 0
        max_new = 0
        for i in range(run_len[g]):
            k = running[g, i]
            if k != chunked:
                decoded += generated[k]
                max_new += output_tokens[k]
        rank_ratio[g] = min(1.0, (decoded + RETRACT_DECODE_STEPS * decoders) / max_new)
    elif decoders > 0:
        rank_ratio[g] = max(rank_ratio[g] - ratio_params[g, 2], ratio_params[g, 1])
    for i in range(run_len[g]):
        k = running[g, i]
        if k != chunked:
            q = spec_query_nb(spec_drafts, generated[k], computed[k], input_tokens[k] + generated[k], seq_limit)
            grow = _grow_nb(computed[k] + q, held[k], block_size)
            kv_allocate_nb(pc, g, grow, blocks_used, num_blocks)
            held[k] += grow
            sched_n[k] = q
            rq.drafts[k] = q - 1
    return retracted


@njit(cache=True)
def _retract_nb(g, i, running, run_len, blocks_used, held, computed, num_preemptions,
                wait_head, wait_tail, wait_next, wait_prev, pc, order, queue_key, queued_ns):
    """Retract ``running[g, i]`` (SGLang): the others keep their order, it frees
    its blocks (its radix-tree ones stay cached), recomputes from scratch later
    and joins the back of waiting (under a keyed order, its place by key: SGLang
    sorts the waiting list, stably, before the next extend batch)."""
    k = running[g, i]
    for j in range(i, run_len[g] - 1):
        running[g, j] = running[g, j + 1]
    run_len[g] -= 1
    radix_release_nb(pc, g, k, held, blocks_used)
    computed[k] = 0
    num_preemptions[k] += 1
    if order == ORDER_FCFS or order >= ORDER_RANDOM:
        wait_push_back_nb(wait_head, wait_tail, wait_next, wait_prev, g, k)
    else:
        wait_insert_nb(wait_head, wait_tail, wait_next, wait_prev, g, k, order, queue_key, queued_ns)


@njit(cache=True)
def reset_ratio_if_idle_nb(first_rank, num_ranks, decode_role, wait_head, rank_inflight,
                           rank_ratio, ratio_params):
    """SGLang's idle reset of new_token_ratio, for a worker that found nothing to run.

    SGLang's event loop resets the ratio to its init on an iteration with no
    batch, except while KV transfers from (P/D prefill) or to (P/D decode) the
    server are in flight, or, on a decode server, while requests wait.  The
    ranks of an attention-DP group idle together (while one rank works the
    others run idle batches).  Harmless for other policies (they do not read
    the ratio).

    Parameters
    ----------
    first_rank, num_ranks : int
        The worker's first global rank and number of ranks.
    decode_role : bool
        The worker is in a P/D decode pool.
    wait_head : ndarray(int64, ndim=1)
        Per rank, first waiting request (-1: none).
    rank_inflight : ndarray(int64, ndim=1)
        Per rank, KV transfers in flight from or to it.
    rank_ratio : ndarray(float64, ndim=1)
        Per rank current new_token_ratio; updated.
    ratio_params : ndarray(float64, ndim=2)
        (ranks, 3) ``[init, min, decay]`` of new_token_ratio.
    """
    for g in range(first_rank, first_rank + num_ranks):
        if rank_inflight[g] > 0 or (decode_role and wait_head[g] >= 0):
            return
    for g in range(first_rank, first_rank + num_ranks):
        rank_ratio[g] = ratio_params[g, 0]


@njit(cache=True)
def batch_summary_nb(summary, r, g, running, run_len, sched_n, computed, input_tokens,
                     generated, extend_batch, decode_role, drafts):
    """Rank g's batch summary (SPEC §8) into ``summary[r]``, from ``sched_n``.

    Computed once per rank and pass, after the builder: a helper taking arrays,
    called per entry in the builders' loops, costs reference-count updates on
    every call (measured: ~30 ns per entry).  An entry is a decode entry if it
    schedules one token at or past the end of its prompt (``computed`` is still
    the value before the pass).  In an SGLang extend batch every entry is an
    extend (prefill) entry, a one-token last chunk included, except the first
    step of a request that entered a P/D decode rank with its prompt's KV.

    Parameters
    ----------
    summary : ndarray(int64, ndim=2)
        Out, (worker ranks, 7): row ``r`` receives ``[num_prefill,
        prefill_tokens, prefill_kv_tokens, num_decode, decode_kv_tokens]`` (tokens)
        and in column 6 the largest ``computed + 1`` of a decode entry (0: none).
    r : int
        Rank index within its worker.
    g : int
        Global rank.
    running : ndarray(int64, ndim=2)
        (ranks, max sequences) running requests per rank.
    run_len : ndarray(int64, ndim=1)
        Running requests per rank.
    sched_n : ndarray(int64, ndim=1)
        Tokens scheduled per request in this pass.
    computed : ndarray(int64, ndim=1)
        Tokens computed per request before the pass.
    input_tokens : ndarray(int64, ndim=1)
        Prompt lengths, tokens.
    generated : ndarray(int64, ndim=1)
        Tokens emitted per request before the pass.
    extend_batch : bool
        The batch is an SGLang extend batch.
    decode_role : bool
        The rank is in a P/D decode pool.
    drafts : ndarray(int64, ndim=1)
        Speculative proposals each request verifies in this pass: its entry is
        a decode entry of ``1 + drafts`` tokens; column 7 receives their sum.
    """
    num_prefill = 0
    prefill_tokens = 0
    prefill_kv_tokens = 0
    num_decode = 0
    decode_kv_tokens = 0
    decode_kv_max = 0
    draft_tokens = 0
    for i in range(run_len[g]):
        k = running[g, i]
        n_tok = sched_n[k]
        if n_tok == 0:
            continue
        if n_tok > 1 and drafts[k] > 0:  # a verification: 1 + its proposals
            is_decode = True
            draft_tokens += drafts[k]
        elif extend_batch:
            # A decode rank's request with nothing generated there yet is an entrant.
            is_decode = decode_role and generated[k] == 0
        else:
            is_decode = n_tok == 1 and computed[k] >= input_tokens[k] - 1
        if is_decode:
            num_decode += 1
            decode_kv_tokens += computed[k] + 1
            decode_kv_max = max(decode_kv_max, computed[k] + 1)
        else:
            num_prefill += 1
            prefill_tokens += n_tok
            prefill_kv_tokens += computed[k] + n_tok
    summary[r, 0] = num_prefill
    summary[r, 1] = prefill_tokens
    summary[r, 2] = prefill_kv_tokens
    summary[r, 3] = num_decode
    summary[r, 4] = decode_kv_tokens
    summary[r, 6] = decode_kv_max
    summary[r, 7] = draft_tokens
