"""Routing kernels: which worker, then which rank, receives a request (docs/routing.md).

Contract: ``@njit(cache=True)`` functions called by the engine's event loop at
the instant of each decision, reading the engine state as it is then.  Their
own state is one int64 array (``route``, :func:`allocate_route_nb`; one array
because numba counts references to every array a call receives):

* per worker: requests outstanding (routed there and not yet left: finished,
  handed off or rejected), prompt tokens pending (routed there and not yet
  past their prompt: first token, handoff or rejection), the round-robin rank
  counter and the least-loaded scan start;
* per rank: requests assigned (waiting or running there, or on their way:
  in the tokenizer, in a KV transfer);
* per handoff h: its decode rank; per request: the worker it is at;
* per worker, its autoscaling status (``W_OFF``, ``W_STARTING``, ``W_READY``,
  ``W_DRAINING``; ``simcore.engine.autoscale_nb`` sets them): when the header's
  gate is set, a decision picks among the ready workers only.

Decisions: the worker when the client sends (the router in front of the
workers sees the request before their tokenizers), over the receiving pool;
the decode worker at the handoff (the transfer needs its destination); the
rank by ``rank_policy``: round robin over the worker's requests in the order
they were routed to it (at the worker decision), or vLLM's DP load balancer at
the engine arrival (after tokenization, as in vLLM's API server), and at the
handoff for the decode pool.  Every tie goes to the first candidate in a scan
that starts at the decision's sequence number modulo the candidates.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from simcore.enums import RankPolicy, RouterPolicy
from simcore.scheduler.kv_nb import HDR_OFFSET, _map_find_nb

# Header of the state array: the counts that place its parts.
_WORKERS = 0
_RANKS = 1
_REQUESTS = 2
_GATED = 3
_HEADER = 4

#: A worker's autoscaling status: only a ready worker takes requests when gated.
W_OFF = 0
W_STARTING = 1
W_READY = 2
W_DRAINING = 3
W_FAILED = 4


@njit(cache=True)
def allocate_route_nb(num_workers, num_ranks, n, gated=False):
    """The routing state, all counts 0, every worker ready.

    Parameters
    ----------
    num_workers, num_ranks : int
        Workers and ranks of the deployment (global indices).
    n : int
        Requests (0 when no policy routes: the per-request parts are unused).
    gated : bool
        Autoscaling: decisions skip the workers that are not ready.

    Returns
    -------
    ndarray(int64, ndim=1)
        The state array (layout in the module docstring).
    """
    route = np.zeros(_HEADER + 5 * num_workers + num_ranks + 2 * n, dtype=np.int64)
    route[_WORKERS] = num_workers
    route[_RANKS] = num_ranks
    route[_REQUESTS] = n
    route[_GATED] = 1 if gated else 0
    route[_status(route):] = W_READY
    return route


@njit(cache=True)
def _status(route):
    return _HEADER + 4 * route[_WORKERS] + route[_RANKS] + 2 * route[_REQUESTS]


@njit(cache=True)
def worker_status_nb(route, w):
    """Worker w's autoscaling status (``W_*``).

    Parameters
    ----------
    route : ndarray(int64, ndim=1)
        The routing state (``Loop.route``; worker statuses, outstanding requests).
    w : int
        Worker.

    Returns
    -------
    int
    """
    return route[_status(route) + w]


@njit(cache=True)
def set_worker_status_nb(route, w, status):
    """Set worker w's autoscaling status (``W_*``).

    Parameters
    ----------
    route : ndarray(int64, ndim=1)
        The routing state (``Loop.route``; worker statuses, outstanding requests).
    w : int
        Worker.
    status : int
        ``W_*``.
    """
    route[_status(route) + w] = status


@njit(cache=True)
def worker_outstanding_nb(route, w):
    """Requests routed to worker w and not yet left.

    Parameters
    ----------
    route : ndarray(int64, ndim=1)
        The routing state (``Loop.route``; worker statuses, outstanding requests).
    w : int
        Worker.

    Returns
    -------
    int
    """
    return route[_outstanding(route) + w]


@njit(cache=True)
def _eligible(route, w):
    return route[_GATED] == 0 or route[_status(route) + w] == W_READY


@njit(cache=True)
def _outstanding(route):
    return _HEADER


@njit(cache=True)
def _pending(route):
    return _HEADER + route[_WORKERS]


@njit(cache=True)
def _rank_counter(route):
    return _HEADER + 2 * route[_WORKERS]


@njit(cache=True)
def _scan_start(route):
    return _HEADER + 3 * route[_WORKERS]


@njit(cache=True)
def _rank_load(route):
    return _HEADER + 4 * route[_WORKERS]


@njit(cache=True)
def _handoff_rank(route):
    return _HEADER + 4 * route[_WORKERS] + route[_RANKS]


@njit(cache=True)
def _request_worker(route):
    return _HEADER + 4 * route[_WORKERS] + route[_RANKS] + route[_REQUESTS]


@njit(cache=True)
def _token_load(route, w, worker_first_rank, worker_num_ranks, blocks_used, rank_block_size):
    """least_tokens: prompt tokens pending plus the tokens of the KV blocks in use on the worker's ranks."""
    load = route[_pending(route) + w]
    for g in range(worker_first_rank[w], worker_first_rank[w] + worker_num_ranks[w]):
        load += blocks_used[g] * rank_block_size[g]
    return load


@njit(cache=True)
def _queued(route, w, worker_first_rank, worker_num_ranks, run_len):
    """Requests outstanding at worker w that are not running (in its tokenizer or waiting)."""
    q = route[_outstanding(route) + w]
    for g in range(worker_first_rank[w], worker_first_rank[w] + worker_num_ranks[w]):
        q -= run_len[g]
    return q


@njit(cache=True)
def _prefix_match(prefix_cache, k, g, num_ranks):
    """Leading prompt blocks of request k resident in rank g's cache (referenced or cached)."""
    s = prefix_cache[0]
    ident = prefix_cache[1]
    first = s[s[HDR_OFFSET] + k]
    total = s[s[HDR_OFFSET] + k + 1] - first
    j = 0
    while j < total and _map_find_nb(s, ident[first + j] * num_ranks + g) >= 0:
        j += 1
    return j


@njit(cache=True)
def _prefix_aware(route, k, start, first, count, weights, worker_first_rank, worker_num_ranks, run_len,
                  blocks_used, rank_num_blocks, prefix_cache):
    """llm-d's scorer sum: w_prefix x matched/total blocks + w_queue x queue score + w_kv x (1 - KV usage).

    The queue score is (max - q) / (max - min) over the candidates (1 when all
    are equal), q = requests queued (:func:`_queued`); the match is the best of
    the worker's ranks.  The highest sum wins.
    """
    s = prefix_cache[0]
    total = s[s[HDR_OFFSET] + k + 1] - s[s[HDR_OFFSET] + k]
    num_ranks = rank_num_blocks.shape[0]
    q_min = np.int64(0)
    q_max = np.int64(0)
    seen = False
    for i in range(count):
        if not _eligible(route, first + i):
            continue
        q = _queued(route, first + i, worker_first_rank, worker_num_ranks, run_len)
        if not seen or q < q_min:
            q_min = q
        if not seen or q > q_max:
            q_max = q
        seen = True
    best = -1
    best_score = 0.0
    for i in range(count):
        w = first + (start + i) % count
        if not _eligible(route, w):
            continue
        match = 0
        used = 0
        capacity = 0
        for g in range(worker_first_rank[w], worker_first_rank[w] + worker_num_ranks[w]):
            match = max(match, _prefix_match(prefix_cache, k, g, num_ranks))
            used += blocks_used[g]
            capacity += rank_num_blocks[g]
        prefix = match / total if total > 0 else 0.0
        if q_max == q_min:
            queue = 1.0
        else:
            queue = (q_max - _queued(route, w, worker_first_rank, worker_num_ranks, run_len)) / (q_max - q_min)
        score = weights[0] * prefix + weights[1] * queue + weights[2] * (1.0 - used / capacity)
        if best < 0 or score > best_score:
            best = w
            best_score = score
    return best


@njit(cache=True)
def _pick_worker(route, policy, seq, k, first, count, draws, weights, worker_first_rank, worker_num_ranks,
                 run_len, blocks_used, rank_num_blocks, rank_block_size, prefix_cache):
    """The worker (global index) among ``first .. first + count - 1`` for decision ``seq`` (request k)."""
    if policy == RouterPolicy.round_robin:
        if route[_GATED] == 0:
            return first + seq % count
        ready = 0  # the (seq mod ready)-th ready worker
        for w in range(first, first + count):
            if _eligible(route, w):
                ready += 1
        i = seq % ready
        for w in range(first, first + count):
            if _eligible(route, w):
                if i == 0:
                    return w
                i -= 1
    if policy == RouterPolicy.random:
        return first + draws[2 * seq]
    outstanding = _outstanding(route)
    if policy == RouterPolicy.power_of_two:  # the first draw unless the second has fewer outstanding
        a = first + draws[2 * seq]
        b = first + draws[2 * seq + 1]
        return b if route[outstanding + b] < route[outstanding + a] else a
    start = seq % count
    if policy == RouterPolicy.prefix_aware:
        return _prefix_aware(route, k, start, first, count, weights, worker_first_rank, worker_num_ranks,
                             run_len, blocks_used, rank_num_blocks, prefix_cache)
    if policy != RouterPolicy.least_outstanding and policy != RouterPolicy.least_tokens:
        # An undeclared code is an error, never another policy.
        raise ValueError("unknown router policy code (not in simcore.enums.RouterPolicy)")
    best = -1
    best_load = np.int64(0)
    for i in range(count):
        w = first + (start + i) % count
        if not _eligible(route, w):
            continue
        if policy == RouterPolicy.least_outstanding:
            load = route[outstanding + w]
        else:
            load = _token_load(route, w, worker_first_rank, worker_num_ranks, blocks_used, rank_block_size)
        if best < 0 or load < best_load:
            best = w
            best_load = load
    return best


@njit(cache=True)
def _least_loaded_rank(route, w, worker_first_rank, worker_num_ranks, run_len, blocks_used, rank_num_blocks):
    """vLLM's DP load balancer (DPLBAsyncMPClient.get_core_engine_for_request) on exact counts.

    Score = waiting + running, plus waiting x 6 x max(0, KV usage - 0.5)
    when some wait; the lowest wins, the first in a scan whose start rotates
    by one per decision.
    """
    r_count = worker_num_ranks[w]
    start = route[_scan_start(route) + w] % r_count
    route[_scan_start(route) + w] += 1
    load = _rank_load(route)
    best = -1
    best_score = 0.0
    for i in range(r_count):
        g = worker_first_rank[w] + (start + i) % r_count
        waiting = route[load + g] - run_len[g]
        score = float(route[load + g])
        if waiting > 0:
            score += waiting * 6.0 * max(0.0, blocks_used[g] / rank_num_blocks[g] - 0.5)
        if best < 0 or score < best_score:
            best = g
            best_score = score
    return best


@njit(cache=True)
def _assign_rank(route, g):
    route[_rank_load(route) + g] += 1
    return g


@njit(cache=True)
def _round_robin_rank(route, w, worker_first_rank, worker_num_ranks):
    """The worker's next rank in the order requests are routed to it."""
    counter = _rank_counter(route) + w
    g = worker_first_rank[w] + route[counter] % worker_num_ranks[w]
    route[counter] += 1
    return _assign_rank(route, g)


@njit(cache=True)
def _enter_worker(route, k, w, tokens):
    route[_outstanding(route) + w] += 1
    route[_pending(route) + w] += tokens
    route[_request_worker(route) + k] = w


@njit(cache=True)
def route_send_nb(route, seq, k, policy, rank_policy, first, count, draws, weights, input_tokens, worker_first_rank,
                  worker_num_ranks, run_len, blocks_used, rank_num_blocks, rank_block_size, prefix_cache,
                  placed_rank):
    """Send seq of request k: its worker, and its rank if the worker's rank policy is round robin.

    Parameters
    ----------
    route : ndarray(int64, ndim=1)
        The routing state; updated.
    seq : int
        The send sequence number (= k, except with multi-turn sessions): it
        starts the tie scan and indexes the draws.
    k : int
        The request row.
    policy : int
        ``RouterPolicy`` code (``simcore.enums``) of the receiving pool.
    rank_policy : ndarray(int64, ndim=1)
        ``RankPolicy`` code per worker.
    first, count : int
        The receiving pool's workers: ``first .. first + count - 1``.
    draws : ndarray(int64, ndim=1)
        Two seeded workers per send (``random``, ``power_of_two``).
    weights : ndarray(float64, ndim=1)
        ``prefix_aware``'s weights: prefix, queue, kv_cache.
    input_tokens : ndarray(int64, ndim=1)
        Prompt tokens per request.
    worker_first_rank, worker_num_ranks : ndarray(int64, ndim=1)
        Each worker's ranks.
    run_len, blocks_used, rank_num_blocks, rank_block_size : ndarray(int64, ndim=1)
        Per rank: running requests, blocks in use, KV blocks, tokens per block.
    prefix_cache : tuple of ndarray(int64, ndim=1)
        The ``simcore.scheduler.kv_nb`` cache (read only).
    placed_rank : ndarray(int64, ndim=1)
        Out: request k's global rank, or left -1 for :func:`route_arrival_nb`.

    Returns
    -------
    int
        The worker (global index).
    """
    w = _pick_worker(route, policy, seq, k, first, count, draws, weights, worker_first_rank, worker_num_ranks,
                     run_len, blocks_used, rank_num_blocks, rank_block_size, prefix_cache)
    _enter_worker(route, k, w, input_tokens[k])
    if rank_policy[w] == RankPolicy.round_robin:
        placed_rank[k] = _round_robin_rank(route, w, worker_first_rank, worker_num_ranks)
    elif rank_policy[w] != RankPolicy.least_loaded:  # least_loaded picks at the arrival
        raise ValueError("unknown rank policy code (not in simcore.enums.RankPolicy)")
    return w


@njit(cache=True)
def route_arrival_nb(route, k, worker_first_rank, worker_num_ranks, run_len, blocks_used, rank_num_blocks,
                     placed_rank):
    """Engine arrival of k: a least-loaded rank policy picks its rank now (else it was set at the send).

    Parameters
    ----------
    route : ndarray(int64, ndim=1)
        The routing state; updated.
    k : int
        The request.
    worker_first_rank, worker_num_ranks : ndarray(int64, ndim=1)
        Each worker's ranks.
    run_len, blocks_used, rank_num_blocks : ndarray(int64, ndim=1)
        Per rank: running requests, blocks in use, KV blocks.
    placed_rank : ndarray(int64, ndim=1)
        Request k's global rank; set here if -1.

    Returns
    -------
    int
        Request k's global rank.
    """
    if placed_rank[k] < 0:
        w = route[_request_worker(route) + k]
        placed_rank[k] = _assign_rank(
            route, _least_loaded_rank(route, w, worker_first_rank, worker_num_ranks, run_len, blocks_used,
                                      rank_num_blocks),
        )
    return placed_rank[k]


@njit(cache=True)
def route_handoff_nb(route, h, k, policy, rank_policy, first, count, draws, weights, tokens, worker_first_rank,
                     worker_num_ranks, run_len, blocks_used, rank_num_blocks, rank_block_size, prefix_cache):
    """Handoff h of request k: its decode worker and rank, kept for the transfer end (:func:`handoff_rank_nb`).

    Parameters
    ----------
    route : ndarray(int64, ndim=1)
        The routing state; updated.
    h, k : int
        The handoff number and its request.
    policy : int
        ``RouterPolicy`` code of the decode pool.
    rank_policy : ndarray(int64, ndim=1)
        ``RankPolicy`` code per worker.
    first, count : int
        The decode pool's workers: ``first .. first + count - 1``.
    draws : ndarray(int64, ndim=1)
        Two seeded decode workers per handoff.
    weights : ndarray(float64, ndim=1)
        As :func:`route_send_nb` (the decode pool has no ``prefix_aware``).
    tokens : int
        Request k's prompt tokens.
    worker_first_rank, worker_num_ranks, run_len, blocks_used, rank_num_blocks, rank_block_size, prefix_cache
        As :func:`route_send_nb`.

    Returns
    -------
    int
        The decode rank (global index).
    """
    w = _pick_worker(route, policy, h, k, first, count, draws, weights, worker_first_rank, worker_num_ranks,
                     run_len, blocks_used, rank_num_blocks, rank_block_size, prefix_cache)
    _enter_worker(route, k, w, tokens)
    if rank_policy[w] == RankPolicy.round_robin:
        g = _round_robin_rank(route, w, worker_first_rank, worker_num_ranks)
    elif rank_policy[w] == RankPolicy.least_loaded:
        g = _assign_rank(route, _least_loaded_rank(route, w, worker_first_rank, worker_num_ranks, run_len,
                                                   blocks_used, rank_num_blocks))
    else:
        raise ValueError("unknown rank policy code (not in simcore.enums.RankPolicy)")
    route[_handoff_rank(route) + h] = g
    return g


@njit(cache=True)
def handoff_rank_nb(route, h):
    """The decode rank :func:`route_handoff_nb` chose for a handoff.

    Parameters
    ----------
    route : ndarray(int64, ndim=1)
        The routing state.
    h : int
        The handoff number.

    Returns
    -------
    int
        Its global decode rank.
    """
    return route[_handoff_rank(route) + h]


@njit(cache=True)
def route_prompt_done_nb(route, k, tokens):
    """Request k is past its prompt at its worker (first token, handoff or rejection): no longer pending.

    Parameters
    ----------
    route : ndarray(int64, ndim=1)
        The routing state; updated.
    k : int
        The request.
    tokens : int
        Its prompt tokens.
    """
    route[_pending(route) + route[_request_worker(route) + k]] -= tokens


@njit(cache=True)
def route_lose_nb(route, k, g, tokens, prompt_done):
    """Request k is lost with its worker (docs/failures.md): it leaves the worker's counts and rank g's (if >= 0).

    Parameters
    ----------
    route : ndarray(int64, ndim=1)
        The routing state; updated.
    k : int
        The request.
    g : int
        Its global rank, or -1 (not yet picked).
    tokens : int
        Its prompt tokens.
    prompt_done : bool
        Whether it was past its prompt (no longer pending).
    """
    w = route[_request_worker(route) + k]
    route[_outstanding(route) + w] -= 1
    if not prompt_done:
        route[_pending(route) + w] -= tokens
    if g >= 0:
        route[_rank_load(route) + g] -= 1


@njit(cache=True)
def route_leave_nb(route, k, g):
    """Request k leaves its worker and rank g (finished, handed off or rejected).

    Parameters
    ----------
    route : ndarray(int64, ndim=1)
        The routing state; updated.
    k : int
        The request.
    g : int
        Its global rank.
    """
    route[_outstanding(route) + route[_request_worker(route) + k]] -= 1
    route[_rank_load(route) + g] -= 1
