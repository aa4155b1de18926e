"""KV-offload kernels: a CPU tier of prefix-cache blocks per rank (docs/prefix-caching.md).

The tier follows vLLM's OffloadingConnector with its LRU manager: prompt
blocks are stored to the CPU as they are computed (write-through, never on
GPU eviction), a waiting request whose prefix continues in the CPU tier past
its GPU hit loads those blocks asynchronously while it stays in the waiting
queue (later requests may be admitted meanwhile), and it is scheduled once the
load has ended.

Contract as in ``simcore.scheduler.kv_nb``: ``@njit(cache=True)`` functions
over one int64 state array at the offsets its header gives: the tail of the
prefix-cache state ``pc[0]`` (``allocate_prefix_cache(..., tail=...)``; its
last word gives where the tier starts), so that the cache stays one tuple of
two arrays for every ``kv_*`` call (numba counts references to each).  The header puts the probe mask,
hash shift and map offset where ``kv_nb``'s map functions read them, so the
CPU map (``identity x num_ranks + rank`` -> CPU slot) reuses them.  Parts:

* the map; per CPU slot (``C_*``): key, pin count (loads reading it), links
  in its rank's LRU list (head: least recently used); a stack of unused slots;
* per rank (``R_*``): LRU head, tail, blocks held, capacity (0: no tier), the
  instant its copy stream is free (loads run one after another) and the loads
  in flight;
* per request (``Q_*``): load state, GPU hits and blocks covered at the load,
  next prompt block to store, CPU tokens at the first admission, load time;
* a heap of load ends (instant, request) and the blocks moved each way.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from simcore.heap_nb import heap_pop_nb, heap_push_nb
from simcore.scheduler.kv_nb import (
    HDR_OFFSET,
    HDR_SLOTS,
    R_CACHED,
    R_HEAD,
    R_TAIL,
    S_NEXT,
    S_REF,
    SLOT_WIDTH,
    _lru_push_tail_nb,
    _lru_remove_nb,
    _map_delete_nb,
    _map_find_nb,
    _map_insert_nb,
    kv_allocate_nb,
    kv_hits_nb,
    kv_register_nb,
    kv_take_hits_nb,
)

# Header; slots 1, 2, 4 and 5 are where kv_nb's map and LRU functions find the
# mask, shift, map and slots, which they serve here too.
O_FREE_TOP = 0
O_MAP_MASK = 1
O_MAP_SHIFT = 2
O_HEAP_SIZE = 3
O_MAP = 4
O_SLOTS = HDR_SLOTS
O_FREE = 6
O_RANKS = 7
O_REQUESTS = 8
O_HEAP_KEY = 9
O_HEAP_VAL = 10
O_BLOCK_NS = 11  # one block's copy, ns
O_LOADED = 12  # blocks copied CPU -> GPU
O_STORED = 13  # blocks copied GPU -> CPU
OHEADER = 14

# A CPU slot is laid out as a kv_nb slot: its key, its pins (loads reading it)
# where kv_nb keeps references, its LRU links; a rank starts as kv_nb's (head,
# tail, blocks in the LRU: every block of the tier).
C_KEY = 0
C_PINS = S_REF
C_NEXT = S_NEXT
C_WIDTH = SLOT_WIDTH

R_USED = R_CACHED
R_CAPACITY = 3
R_LOAD_FREE = 4
R_LOADING = 5  # requests whose load is in flight
R_WIDTH = 6

Q_STATE = 0
Q_HITS = 1  # GPU hits at the load, blocks
Q_UPTO = 2  # GPU hits + loaded blocks
Q_NEXT_STORED = 3
Q_CPU_FIRST = 4  # tokens loaded, counted in cached_tokens at the first admission
Q_LOAD_NS = 5  # total time from load issue to load end, ns
Q_WIDTH = 6

IDLE = 0
LOADING = 1
READY = 2  # load ended, not yet reached by the waiting loop
LOADED = 3  # computed set to the loaded tokens, waiting for admission

# offload_admission_nb codes
PROCEED = 0  # admit as usual (with the GPU hits returned)
SKIP = 1  # stays waiting, the loop moves on (loading, or its CPU blocks are being loaded)
ISSUED = 2  # a load started: stays waiting, the loop moves on
BLOCKED = 3  # its load's blocks do not fit: head-of-line stop


def allocate_offload(capacity: np.ndarray, n: int, block_ns: int) -> np.ndarray:
    """The CPU-tier state (Python side): empty tiers of ``capacity[g]`` blocks.

    Parameters
    ----------
    capacity : ndarray(int64, ndim=1)
        CPU blocks per global rank (0: no tier on that rank).
    n : int
        Requests.
    block_ns : int
        One block's copy, ns.

    Returns
    -------
    ndarray(int64, ndim=1)
        The state array.
    """
    num_slots = int(capacity.sum())
    num_ranks = capacity.shape[0]
    bits = max(4, int(2 * max(num_slots, 1) - 1).bit_length())
    sizes = [2 << bits, C_WIDTH * num_slots, num_slots, R_WIDTH * num_ranks, Q_WIDTH * n, n, n]
    bases = OHEADER + np.concatenate([[0], np.cumsum(sizes)])
    state = np.zeros(int(bases[-1]), dtype=np.int64)
    state[:OHEADER] = [num_slots, (1 << bits) - 1, 64 - bits, 0, *bases[:7], block_ns, 0, 0]
    state[bases[0] : bases[1]] = -1
    slots = state[bases[1] : bases[2]].reshape(num_slots, C_WIDTH)
    slots[:] = -1
    slots[:, C_PINS] = 0
    state[bases[2] : bases[3]] = np.arange(num_slots - 1, -1, -1)
    ranks = state[bases[3] : bases[4]].reshape(num_ranks, R_WIDTH)
    ranks[:, R_HEAD] = -1
    ranks[:, R_TAIL] = -1
    ranks[:, R_CAPACITY] = capacity
    return state


@njit(cache=True)
def tier_nb(pc):
    """The CPU tier's state: a view of the tail of the prefix-cache state.

    Parameters
    ----------
    pc : tuple of ndarray(int64, ndim=1)
        The prefix cache ``(state, ident)``.

    Returns
    -------
    ndarray(int64, ndim=1)
    """
    s = pc[0]
    return s[s[s.shape[0] - 1] : s.shape[0] - 1]


@njit(cache=True, inline="always")
def offload_loads_pending_nb(pc):
    """Whether a load is in flight on any rank (inlined: the event loop asks at every instant).

    Parameters
    ----------
    pc : tuple of ndarray(int64, ndim=1)
        The prefix cache ``(state, ident)``.

    Returns
    -------
    bool
    """
    s = pc[0]
    return s[s[s.shape[0] - 1] + O_HEAP_SIZE] > 0


@njit(cache=True)
def offload_enabled_nb(pc, g):
    """Whether rank g has a CPU tier.

    Parameters
    ----------
    pc : tuple of ndarray(int64, ndim=1)
        The prefix cache ``(state, ident)``.
    g : int
        Global rank.

    Returns
    -------
    bool
    """
    o = tier_nb(pc)
    return o[o[O_RANKS] + R_WIDTH * g + R_CAPACITY] > 0


@njit(cache=True)
def _touch_nb(o, rank, ident, first, count, key_rank, num_ranks):
    """Move the resident ones of prompt blocks ``0 .. count-1`` to the MRU end,
    last block first, so that a prefix outlives its tails (LRU ``touch``)."""
    for j in range(count - 1, -1, -1):
        slot = _map_find_nb(o, ident[first + j] * num_ranks + key_rank)
        if slot >= 0 and o[rank + R_TAIL] != slot:
            _lru_remove_nb(o, rank, slot)
            _lru_push_tail_nb(o, rank, slot)


@njit(cache=True)
def offload_admission_nb(pc, g, num_ranks, k, t, known, block_size, num_blocks, max_loads, blocks_used, held, computed,
                         first):
    """Waiting request k reached by rank g's admission loop at t: its CPU-tier step.

    A request with nothing computed is passed over while ``max_loads`` loads
    are in flight on the rank (vLLM's back-pressure); else it looks up its GPU hits (``kv_hits_nb``),
    touches its CPU-resident prompt blocks, and counts the CPU blocks that
    continue its GPU hit.  With at least one, the request takes its GPU hits,
    allocates a GPU block for each CPU block and starts their load (behind the
    rank's loads in flight), unless one of them is being loaded already
    (vLLM delays it) or the blocks do not fit.  A request whose load has
    ended gets its loaded tokens as computed (all but the last token when the
    load covers every known token) and its loaded blocks registered.

    Parameters
    ----------
    pc : tuple of ndarray(int64, ndim=1)
        The prefix cache ``(state, ident)`` (the tier at the state's tail); updated.
    g, num_ranks : int
        Global rank and global ranks.
    k : int
        Request index.
    t : int
        Instant, ns (a load starts at once if the copy stream is free).
    known : int
        Tokens of request k known so far, tokens.
    block_size, num_blocks : int
        Tokens per block and GPU blocks of rank g.
    max_loads : int
        Loads in flight at most (vLLM: ``max_num_seqs``), requests.
    blocks_used, held, computed : ndarray(int64, ndim=1)
        GPU blocks in use per rank, blocks held and tokens computed per request; updated.
    first : bool
        Request k was never admitted (its loaded tokens count in ``cpu_cached_tokens``).

    Returns
    -------
    code : int
        ``PROCEED``, ``SKIP``, ``ISSUED`` or ``BLOCKED``.
    hits, cached : int
        With ``PROCEED`` for a request with nothing computed: its GPU hits and
        how many of them are cached (as ``kv_hits_nb``); else 0.
    """
    o = tier_nb(pc)
    q = o[O_REQUESTS] + Q_WIDTH * k
    state = o[q + Q_STATE]
    if state == LOADING:
        return SKIP, 0, 0
    if state == READY:
        upto = o[q + Q_UPTO]
        tokens = upto * block_size
        if tokens == known:
            tokens -= 1  # vLLM recomputes the last token to sample from it
        computed[k] = tokens
        kv_register_nb(pc, g, num_ranks, k, tokens, block_size)
        if first:
            o[q + Q_CPU_FIRST] = tokens - o[q + Q_HITS] * block_size
        o[q + Q_STATE] = LOADED
        return PROCEED, 0, 0
    if state == LOADED and computed[k] > 0:
        return PROCEED, 0, 0  # loaded earlier, its admission did not fit then
    rank = o[O_RANKS] + R_WIDTH * g
    if o[rank + R_LOADING] >= max_loads:
        return SKIP, 0, 0
    hits, cached = kv_hits_nb(pc, g, num_ranks, k, known, block_size)
    s = pc[0]
    ident = pc[1]
    first_block = s[s[HDR_OFFSET] + k]
    count = s[s[HDR_OFFSET] + k + 1] - first_block
    _touch_nb(o, rank, ident, first_block, count, g, num_ranks)
    loads = 0
    pinned = False
    slots = o[O_SLOTS]
    while hits + loads < count and known > 1:  # a one-token prompt has nothing to load
        slot = _map_find_nb(o, ident[first_block + hits + loads] * num_ranks + g)
        if slot < 0:
            break
        pinned = pinned or o[slots + C_WIDTH * slot + C_PINS] > 0
        loads += 1
    if loads == 0:
        return PROCEED, hits, cached
    if pinned:
        return SKIP, 0, 0
    if loads + cached > num_blocks - blocks_used[g]:
        return BLOCKED, 0, 0
    kv_take_hits_nb(pc, g, k, hits, blocks_used)
    kv_allocate_nb(pc, g, loads, blocks_used, num_blocks)
    held[k] = hits + loads
    for j in range(hits, hits + loads):
        slot = _map_find_nb(o, ident[first_block + j] * num_ranks + g)
        o[slots + C_WIDTH * slot + C_PINS] += 1
    start = max(t, o[rank + R_LOAD_FREE])
    end = start + max(np.int64(1), loads * o[O_BLOCK_NS])
    o[rank + R_LOAD_FREE] = end
    o[rank + R_LOADING] += 1
    o[q + Q_STATE] = LOADING
    o[q + Q_HITS] = hits
    o[q + Q_UPTO] = hits + loads
    o[q + Q_NEXT_STORED] = hits + loads  # vLLM does not store what it loaded
    o[q + Q_LOAD_NS] += end - t
    o[O_LOADED] += loads
    _heap_push_nb(o, end, k)
    return ISSUED, 0, 0


@njit(cache=True)
def _heap_nb(o):
    """The load-end heap's key and value arrays (views into the state)."""
    width = o[O_HEAP_VAL] - o[O_HEAP_KEY]
    return o[o[O_HEAP_KEY] : o[O_HEAP_VAL]], o[o[O_HEAP_VAL] : o[O_HEAP_VAL] + width]


@njit(cache=True)
def _heap_push_nb(o, key, value):
    keys, vals = _heap_nb(o)
    o[O_HEAP_SIZE] = heap_push_nb(keys, vals, o[O_HEAP_SIZE], key, value)


@njit(cache=True)
def offload_next_event_nb(pc, t):
    """The earlier of ``t`` and the first load end, ns.

    Parameters
    ----------
    pc : tuple of ndarray(int64, ndim=1)
        The prefix cache.
    t : int
        The earliest other event, ns.

    Returns
    -------
    int
    """
    o = tier_nb(pc)
    if o[O_HEAP_SIZE] > 0 and o[o[O_HEAP_KEY]] < t:
        return o[o[O_HEAP_KEY]]
    return t


@njit(cache=True)
def offload_loads_end_nb(pc, t, num_ranks, recv_rank):
    """Loads ending at t, by (instant, request): each request's load is ready
    and its CPU blocks are unpinned.  Returns whether any ended.

    Parameters
    ----------
    pc : tuple of ndarray(int64, ndim=1)
        The prefix cache; updated.
    t : int
        Instant, ns.
    num_ranks : int
        Global ranks.
    recv_rank : ndarray(int64, ndim=1)
        Per request, the rank that holds its cache.

    Returns
    -------
    bool
        Whether a load ended at t.
    """
    o = tier_nb(pc)
    ended = False
    keys, vals = _heap_nb(o)
    s = pc[0]
    ident = pc[1]
    slots = o[O_SLOTS]
    while o[O_HEAP_SIZE] > 0 and keys[0] == t:
        k = vals[0]
        o[O_HEAP_SIZE] = heap_pop_nb(keys, vals, o[O_HEAP_SIZE])
        ended = True
        q = o[O_REQUESTS] + Q_WIDTH * k
        o[q + Q_STATE] = READY
        first_block = s[s[HDR_OFFSET] + k]
        g = recv_rank[k]
        o[o[O_RANKS] + R_WIDTH * g + R_LOADING] -= 1
        for j in range(o[q + Q_HITS], o[q + Q_UPTO]):
            slot = _map_find_nb(o, ident[first_block + j] * num_ranks + g)
            o[slots + C_WIDTH * slot + C_PINS] -= 1
    return ended


@njit(cache=True)
def _store_nb(pc, g, num_ranks, k, tokens, block_size):
    """Store request k's prompt blocks completed by ``tokens`` and not stored
    yet (vLLM ``prepare_store``): the ones not in the CPU tier take CPU blocks,
    evicting unpinned blocks from the LRU head; if too few can be evicted the
    store is skipped (and retried at the request's next pass)."""
    s = pc[0]
    o = tier_nb(pc)
    ident = pc[1]
    q = o[O_REQUESTS] + Q_WIDTH * k
    first_block = s[s[HDR_OFFSET] + k]
    upto = min(tokens // block_size, s[s[HDR_OFFSET] + k + 1] - first_block)
    start = o[q + Q_NEXT_STORED]
    if upto <= start:
        return
    rank = o[O_RANKS] + R_WIDTH * g
    slots = o[O_SLOTS]
    new = 0
    for j in range(start, upto):
        if _map_find_nb(o, ident[first_block + j] * num_ranks + g) < 0:
            new += 1
    evict = new - (o[rank + R_CAPACITY] - o[rank + R_USED])
    if evict > 0:
        found = 0
        slot = o[rank + R_HEAD]
        while slot >= 0 and found < evict:
            if o[slots + C_WIDTH * slot + C_PINS] == 0:
                found += 1
            slot = o[slots + C_WIDTH * slot + C_NEXT]
        if found < evict:
            return
        slot = o[rank + R_HEAD]
        while evict > 0:
            at = slots + C_WIDTH * slot
            nxt = o[at + C_NEXT]
            if o[at + C_PINS] == 0:
                _lru_remove_nb(o, rank, slot)
                _map_delete_nb(o, o[at + C_KEY])
                o[o[O_FREE] + o[O_FREE_TOP]] = slot
                o[O_FREE_TOP] += 1
                evict -= 1
            slot = nxt
    for j in range(start, upto):
        key = ident[first_block + j] * num_ranks + g
        if _map_find_nb(o, key) < 0 and o[rank + R_USED] < o[rank + R_CAPACITY]:
            o[O_FREE_TOP] -= 1
            slot = o[o[O_FREE] + o[O_FREE_TOP]]
            o[slots + C_WIDTH * slot + C_KEY] = key
            o[slots + C_WIDTH * slot + C_PINS] = 0
            _map_insert_nb(o, key, slot)
            _lru_push_tail_nb(o, rank, slot)
            o[O_STORED] += 1
    o[q + Q_NEXT_STORED] = upto
    if new > 0:
        _touch_nb(o, rank, ident, first_block, upto, g, num_ranks)


@njit(cache=True)
def offload_store_batch_nb(pc, g, num_ranks, running, run_len, first_admitted, sched_n, computed,
                           num_preemptions, block_size):
    """Store the blocks rank g's batch completes, in vLLM's order (its
    ``build_connector_meta`` after the schedule): newly admitted requests, then
    the running ones, then the resumed (readmitted after a preemption) ones.

    Parameters
    ----------
    pc : tuple of ndarray(int64, ndim=1)
        The prefix cache; updated.
    g, num_ranks : int
        Global rank and global ranks.
    running : ndarray(int64, ndim=2)
        Running requests per rank, in running order.
    run_len : ndarray(int64, ndim=1)
        Running requests per rank.
    first_admitted : int
        Position in ``running[g]`` of the first request admitted by this batch.
    sched_n, computed : ndarray(int64, ndim=1)
        Tokens scheduled in the batch and computed before it, per request.
    num_preemptions : ndarray(int64, ndim=1)
        Per request preemptions (0: a new request).
    block_size : int
        Tokens per block.
    """
    for phase in range(3):
        lo = first_admitted if phase != 1 else 0
        hi = run_len[g] if phase != 1 else first_admitted
        for i in range(lo, hi):
            k = running[g, i]
            if sched_n[k] == 0:
                continue
            if phase == 0 and num_preemptions[k] > 0 or phase == 2 and num_preemptions[k] == 0:
                continue
            _store_nb(pc, g, num_ranks, k, computed[k] + sched_n[k], block_size)

