"""KV-cache kernels for automatic prefix caching (docs/prefix-caching.md).

Contract: ``@njit(cache=True)`` functions over flat int64 arrays.  The cache
is a tuple ``pc`` of two arrays: the requests' prompt-block identities (read
only, built once per configuration) and the state, every part of which lives
in one int64 array at the offsets its header gives (``HDR_*``).  One array,
not one per part, because numba counts references to every array a call
receives, with atomic operations; a state of many arrays made each call cost
more than the work it does.  The parts of the state:

* a linear-probing hash map from ``identity x num_ranks + rank`` to a slot
  (``(key, slot)`` pairs, key -1: empty);
* per slot (an identity-bearing physical block, ``SLOT_WIDTH`` fields
  ``S_*``): its map key, reference count, links in its rank's LRU queue of
  cached (unreferenced) blocks, and the admission-memo stamp;
* a stack of unused slots (its height in the header);
* per rank (``RANK_WIDTH`` fields ``R_*``): LRU head, tail and length (the
  cached blocks) and the admission memo;
* per request: how many prompt blocks are settled (hit or registered), the
  ``n + 1`` offsets of its prompt blocks in the identities, and which slot
  backs each settled prompt block (-1: anonymous; written when the block
  settles or is found).  :func:`kv_hits_nb` reads an entry first (a block's
  last slot, unwritten entries included) and trusts it only if that slot
  bears the block's key: a free slot bears none (key -1).

The admission memo keeps the hit lookup of the request at the head of a
rank's waiting queue while the head is blocked (it is looked up again at every
pass): the slots found carry the memo's generation and their position, so
that evicting one ends the memo's hits before it and releasing one counts it
cached; lookups then resume at the first miss only.

``blocks_used[g]`` counts in-use blocks once (a shared slot once, however
many requests reference it); cached blocks are free for capacity checks and are
evicted, LRU head first, only when an allocation finds no truly free block.
"""

from __future__ import annotations

import numpy as np
from numba import njit

# Header: the free-stack height, the map's probe mask and hash shift, the last
# memo generation, then the offset of each part.
HDR_FREE_TOP = 0
HDR_MAP_MASK = 1
HDR_MAP_SHIFT = 2
HDR_GENERATION = 3
HDR_MAP = 4
HDR_SLOTS = 5
HDR_FREE = 6
HDR_RANKS = 7
HDR_SETTLED = 8
HDR_OFFSET = 9
HDR_BLOCK_SLOT = 10
HEADER = 11

S_KEY = 0
S_REF = 1
S_PREV = 2
S_NEXT = 3
S_STAMP = 4  # generation of the admission memo that found this slot
S_POSITION = 5  # and where in that request's prompt
SLOT_WIDTH = 6

R_HEAD = 0
R_TAIL = 1
R_CACHED = 2
R_MEMO_REQUEST = 3  # -1: no memo
R_MEMO_GENERATION = 4
R_MEMO_LIMIT = 5
R_MEMO_HITS = 6
R_MEMO_CACHED = 7
RANK_WIDTH = 8

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def allocate_prefix_cache(num_slots: int, num_ranks: int, ident_offset: np.ndarray, ident: np.ndarray,
                          tail: np.ndarray | None = None):
    """The cache state tuple for ``num_slots`` identity-bearing blocks (Python side).

    Parameters
    ----------
    num_slots : int
        Identity-bearing blocks over all ranks (blocks per rank x ranks).
    num_ranks : int
        Global ranks.
    ident_offset : ndarray(int64, ndim=1)
        ``n + 1`` offsets of each request's prompt-block identities in ``ident``.
    ident : ndarray(int64, ndim=1)
        Prompt-block identities (>= 0), request by request.
    tail : ndarray(int64, ndim=1), optional
        Another module's state, appended after the cache's parts (in the same
        array: no more arrays per call); the state's last word then holds its
        offset (``simcore.scheduler.offload_nb``).

    Returns
    -------
    tuple of ndarray(int64, ndim=1)
        ``(state, ident)``: the state (empty map, all slots free, no memo)
        and the identities, not copied.
    """
    bits = max(4, int(2 * max(num_slots, 1) - 1).bit_length())
    n = ident_offset.shape[0] - 1
    total = ident.shape[0]
    sizes = [2 << bits, SLOT_WIDTH * num_slots, num_slots, RANK_WIDTH * num_ranks, max(n, 1), n + 1, total]
    bases = HEADER + np.concatenate([[0], np.cumsum(sizes)])
    extra = 0 if tail is None else tail.shape[0] + 1
    state = np.empty(int(bases[-1]) + extra, dtype=np.int64)
    state[:HEADER] = [num_slots, (1 << bits) - 1, 64 - bits, 0, *bases[:-1]]
    state[bases[0] : bases[1]] = -1
    slots = state[bases[1] : bases[2]].reshape(num_slots, SLOT_WIDTH)
    slots[:] = -1
    slots[:, S_REF] = 0
    slots[:, S_STAMP] = 0
    slots[:, S_POSITION] = 0
    state[bases[2] : bases[3]] = np.arange(num_slots - 1, -1, -1)
    ranks = state[bases[3] : bases[4]].reshape(num_ranks, RANK_WIDTH)
    ranks[:] = 0
    ranks[:, [R_HEAD, R_TAIL, R_MEMO_REQUEST]] = -1
    state[bases[4] : bases[5]] = 0
    state[bases[5] : bases[6]] = ident_offset
    if tail is not None:
        state[bases[-1] : -1] = tail
        state[-1] = bases[-1]
    return (state, np.ascontiguousarray(ident, dtype=np.int64))


@njit(cache=True)
def _map_home_nb(s, key):
    """Offset in ``s`` of the map entry where ``key``'s probe starts."""
    return s[HDR_MAP] + 2 * np.int64((np.uint64(key) * _GOLDEN) >> np.uint64(s[HDR_MAP_SHIFT]))


@njit(cache=True)
def _map_probe_nb(s, key):
    """Offset in ``s`` of ``key``'s map entry, or of the empty entry where it would go."""
    base, mask = s[HDR_MAP], s[HDR_MAP_MASK]
    i = (_map_home_nb(s, key) - base) >> 1
    while True:
        here = s[base + 2 * i]
        if here == key or here == -1:
            return base + 2 * i
        i = (i + 1) & mask


@njit(cache=True)
def _map_find_nb(s, key):
    at = _map_probe_nb(s, key)
    return s[at + 1] if s[at] == key else -1


@njit(cache=True)
def _map_insert_nb(s, key, slot):
    """Map ``key`` (absent) to ``slot``."""
    at = _map_probe_nb(s, key)
    s[at] = key
    s[at + 1] = slot


@njit(cache=True)
def _map_delete_nb(s, key):
    """Remove ``key``, shifting later entries of its probe run back (no tombstones)."""
    base, mask = s[HDR_MAP], s[HDR_MAP_MASK]
    i = (_map_probe_nb(s, key) - base) >> 1
    j = i
    while True:
        j = (j + 1) & mask
        moved = s[base + 2 * j]
        if moved == -1:
            break
        home = (_map_home_nb(s, moved) - base) >> 1
        # Move entry j into the hole at i unless its home lies cyclically in (i, j].
        if (i < j and (home <= i or home > j)) or (i > j and home <= i and home > j):
            s[base + 2 * i] = moved
            s[base + 2 * i + 1] = s[base + 2 * j + 1]
            i = j
    s[base + 2 * i] = -1


@njit(cache=True)
def _lru_remove_nb(s, rank, slot):
    """Unlink ``slot`` from the LRU queue of the rank whose fields start at offset ``rank``."""
    slots = s[HDR_SLOTS]
    at = slots + SLOT_WIDTH * slot
    prev, nxt = s[at + S_PREV], s[at + S_NEXT]
    if prev >= 0:
        s[slots + SLOT_WIDTH * prev + S_NEXT] = nxt
    else:
        s[rank + R_HEAD] = nxt
    if nxt >= 0:
        s[slots + SLOT_WIDTH * nxt + S_PREV] = prev
    else:
        s[rank + R_TAIL] = prev
    s[at + S_PREV] = -1
    s[at + S_NEXT] = -1
    s[rank + R_CACHED] -= 1


@njit(cache=True)
def _lru_push_tail_nb(s, rank, slot):
    slots = s[HDR_SLOTS]
    tail = s[rank + R_TAIL]
    s[slots + SLOT_WIDTH * slot + S_PREV] = tail
    s[slots + SLOT_WIDTH * slot + S_NEXT] = -1
    if tail >= 0:
        s[slots + SLOT_WIDTH * tail + S_NEXT] = slot
    else:
        s[rank + R_HEAD] = slot
    s[rank + R_TAIL] = slot
    s[rank + R_CACHED] += 1


@njit(cache=True)
def _in_memo_nb(s, rank, at):
    """Whether the slot at offset ``at`` is one of the hits the rank's memo holds."""
    return s[at + S_STAMP] == s[rank + R_MEMO_GENERATION] and s[at + S_POSITION] < s[rank + R_MEMO_HITS]


@njit(cache=True)
def _truncate_memo_nb(s, rank, position):
    """The memo's hit at ``position`` is being evicted: the hits end before it.

    The cached hits dropped are recounted from their slots (each hit is
    dropped once per memo: as many reads as lookups made it).
    """
    request = s[rank + R_MEMO_REQUEST]
    if request < 0:
        return
    slots = s[HDR_SLOTS]
    block_slot = s[HDR_BLOCK_SLOT] + s[s[HDR_OFFSET] + request]
    for j in range(position, s[rank + R_MEMO_HITS]):
        if s[slots + SLOT_WIDTH * s[block_slot + j] + S_REF] == 0:
            s[rank + R_MEMO_CACHED] -= 1
    s[rank + R_MEMO_HITS] = position


@njit(cache=True)
def kv_allocate_nb(pc, g, count, blocks_used, num_blocks):
    """Take ``count`` blocks on rank g, evicting cached blocks (LRU head first)
    when the truly free ones do not suffice.

    Parameters
    ----------
    pc : tuple of ndarray(int64, ndim=1)
        The prefix cache ``(state, ident)``; the state is mutated in place.
    g : int
        Global rank.
    count : int
        Blocks to take.
    blocks_used : ndarray(int64, ndim=1)
        In-use blocks per rank; ``blocks_used[g]`` grows by ``count``.
    num_blocks : int
        KV blocks of rank g.
    """
    s = pc[0]
    rank = s[HDR_RANKS] + RANK_WIDTH * g
    slots = s[HDR_SLOTS]
    shortfall = blocks_used[g] + count + s[rank + R_CACHED] - num_blocks
    for _ in range(shortfall):
        slot = s[rank + R_HEAD]
        at = slots + SLOT_WIDTH * slot
        _lru_remove_nb(s, rank, slot)
        _map_delete_nb(s, s[at + S_KEY])
        if _in_memo_nb(s, rank, at):
            _truncate_memo_nb(s, rank, s[at + S_POSITION])
        s[at + S_KEY] = -1  # a free slot has no identity (kv_hits_nb trusts a slot's key)
        s[at + S_STAMP] = 0  # a stamp holds only while the slot keeps its identity
        top = s[HDR_FREE_TOP]
        s[s[HDR_FREE] + top] = slot
        s[HDR_FREE_TOP] = top + 1
    blocks_used[g] += count


@njit(cache=True)
def kv_hits_nb(pc, g, num_ranks, k, known, block_size):
    """Leading complete prompt blocks of request k resident on rank g, with at
    least the last known token left to compute; and how many of them are cached.

    The slots found are noted in request k's block-slot entries (beyond its
    settled blocks, which a waiting request has none of), for
    :func:`kv_take_hits_nb` to take without looking them up again.  Asked
    again for the same request on the same rank (a blocked queue head), the
    rank's admission memo gives the hits of the last call, still resident,
    and the lookups resume at the first miss.

    Parameters
    ----------
    pc : tuple of ndarray(int64, ndim=1)
        The prefix cache ``(state, ident)`` (read only but request k's
        block-slot entries and rank g's memo).
    g : int
        Global rank.
    num_ranks : int
        Global ranks (map keys are ``identity x num_ranks + rank``).
    k : int
        Request index.
    known : int
        Tokens of request k known so far (prompt + generated), tokens.
    block_size : int
        Tokens per block.

    Returns
    -------
    hits : int
        Resident leading prompt blocks, blocks.
    cached : int
        Of those, blocks unreferenced (in the LRU queue), blocks.
    """
    s = pc[0]
    rank = s[HDR_RANKS] + RANK_WIDTH * g
    slots = s[HDR_SLOTS]
    first = s[s[HDR_OFFSET] + k]
    limit = min(s[s[HDR_OFFSET] + k + 1] - first, (known - 1) // block_size)
    if s[rank + R_MEMO_REQUEST] == k and s[rank + R_MEMO_LIMIT] == limit:
        generation = s[rank + R_MEMO_GENERATION]
        hits = s[rank + R_MEMO_HITS]
        cached = s[rank + R_MEMO_CACHED]
    else:
        generation = s[HDR_GENERATION] + 1
        s[HDR_GENERATION] = generation
        hits = 0
        cached = 0
    keep = True
    ident = pc[1]
    block_slot = s[HDR_BLOCK_SLOT] + first
    num_slots = (s[HDR_FREE] - slots) // SLOT_WIDTH
    while hits < limit:
        key = ident[first + hits] * num_ranks + g
        # The slot this block last had (a request readmitted after a preemption
        # finds its own blocks) is the resident one if it still bears the key:
        # no map probe then.  Unwritten or stale entries fail the check.
        slot = s[block_slot + hits]
        if not (slot >= 0 and slot < num_slots and s[slots + SLOT_WIDTH * slot + S_KEY] == key):
            slot = _map_find_nb(s, key)
            if slot < 0:
                break
        at = slots + SLOT_WIDTH * slot
        # A slot met twice (an identity repeated in one prompt) would be
        # counted once by the memo's updates: keep no memo then.
        keep = keep and not (s[at + S_STAMP] == generation and s[at + S_POSITION] < hits)
        s[at + S_STAMP] = generation
        s[at + S_POSITION] = hits
        if s[at + S_REF] == 0:
            cached += 1
        s[block_slot + hits] = slot
        hits += 1
    s[rank + R_MEMO_REQUEST] = k if keep else -1
    s[rank + R_MEMO_GENERATION] = generation
    s[rank + R_MEMO_LIMIT] = limit
    s[rank + R_MEMO_HITS] = hits
    s[rank + R_MEMO_CACHED] = cached
    return hits, cached


@njit(cache=True)
def kv_take_hits_nb(pc, g, k, hits, blocks_used):
    """Reference request k's first ``hits`` prompt blocks (resident on rank g).

    Their slots are those :func:`kv_hits_nb` just noted (the cache has not
    changed since).  Request k leaves the waiting queue: rank g's memo ends.

    Parameters
    ----------
    pc : tuple of ndarray(int64, ndim=1)
        The prefix cache ``(state, ident)``; the state is mutated in place.
    g : int
        Global rank.
    k : int
        Request index.
    hits : int
        Leading prompt blocks to reference (from :func:`kv_hits_nb`, called
        last for request k on this rank), blocks.
    blocks_used : ndarray(int64, ndim=1)
        In-use blocks per rank; grows by the cached blocks taken out of the LRU.
    """
    s = pc[0]
    rank = s[HDR_RANKS] + RANK_WIDTH * g
    slots = s[HDR_SLOTS]
    s[rank + R_MEMO_REQUEST] = -1
    block_slot = s[HDR_BLOCK_SLOT] + s[s[HDR_OFFSET] + k]
    for j in range(hits):
        slot = s[block_slot + j]
        at = slots + SLOT_WIDTH * slot
        if s[at + S_REF] == 0:
            _lru_remove_nb(s, rank, slot)
            blocks_used[g] += 1
        s[at + S_REF] += 1
    s[s[HDR_SETTLED] + k] = hits


@njit(cache=True)
def kv_register_nb(pc, g, num_ranks, k, tokens, block_size):
    """Give identities to request k's prompt blocks completed by ``tokens``
    computed tokens, in block order, unless the identity is already resident.

    Parameters
    ----------
    pc : tuple of ndarray(int64, ndim=1)
        The prefix cache ``(state, ident)``; the state is mutated in place.
    g : int
        Global rank.
    num_ranks : int
        Global ranks.
    k : int
        Request index.
    tokens : int
        Request k's computed tokens after the pass, tokens.
    block_size : int
        Tokens per block.
    """
    s = pc[0]
    settled = s[HDR_SETTLED] + k
    first = s[s[HDR_OFFSET] + k]
    complete = min(tokens // block_size, s[s[HDR_OFFSET] + k + 1] - first)
    if complete <= s[settled]:
        return
    slots = s[HDR_SLOTS]
    ident = pc[1]
    block_slot = s[HDR_BLOCK_SLOT] + first
    for j in range(s[settled], complete):
        key = ident[first + j] * num_ranks + g
        entry = _map_probe_nb(s, key)
        slot = -1
        if s[entry] != key:  # not resident: a new slot, mapped at the entry the probe ended on
            top = s[HDR_FREE_TOP] - 1
            slot = s[s[HDR_FREE] + top]
            s[HDR_FREE_TOP] = top
            s[slots + SLOT_WIDTH * slot + S_KEY] = key
            s[slots + SLOT_WIDTH * slot + S_REF] = 1
            s[entry] = key
            s[entry + 1] = slot
        s[block_slot + j] = slot
    s[settled] = complete


@njit(cache=True)
def kv_release_nb(pc, g, k, held, blocks_used):
    """Drop request k's blocks on rank g in reverse block order: identity-bearing
    blocks whose last reference goes join the LRU tail, the rest become free.

    Parameters
    ----------
    pc : tuple of ndarray(int64, ndim=1)
        The prefix cache ``(state, ident)``; the state is mutated in place.
    g : int
        Global rank.
    k : int
        Request index.
    held : ndarray(int64, ndim=1)
        Blocks held per request; ``held[k]`` is set to 0.
    blocks_used : ndarray(int64, ndim=1)
        In-use blocks per rank; ``blocks_used[g]`` shrinks accordingly.
    """
    s = pc[0]
    settled = s[HDR_SETTLED] + k
    anonymous = held[k]
    if s[settled] > 0:
        rank = s[HDR_RANKS] + RANK_WIDTH * g
        slots = s[HDR_SLOTS]
        block_slot = s[HDR_BLOCK_SLOT] + s[s[HDR_OFFSET] + k]
        for j in range(s[settled] - 1, -1, -1):
            slot = s[block_slot + j]
            if slot >= 0:
                anonymous -= 1
                at = slots + SLOT_WIDTH * slot
                s[at + S_REF] -= 1
                if s[at + S_REF] == 0:
                    blocks_used[g] -= 1
                    _lru_push_tail_nb(s, rank, slot)
                    if _in_memo_nb(s, rank, at):
                        s[rank + R_MEMO_CACHED] += 1  # a hit of the blocked head is now cached
        s[settled] = 0
    blocks_used[g] -= anonymous
    held[k] = 0


@njit(cache=True)
def trace_block_identities_nb(offset, list_offsets, hash_rank, block_size, trace_block, unique_base, ident):
    """Identities of the complete prompt blocks of a trace with ``hash_ids``.

    Block j of request k ends at token ``e = (j+1)·bs``, in trace block ``m =
    (e - 1) div T``; its identity is the pair (``hash_ids[m]``, ``e - m·T``),
    numbered ``hash_rank x T + e - m·T - 1``.  A block past the request's
    hash_ids (a short list) is unique to it: ``unique_base`` + its flat index.

    Parameters
    ----------
    offset : ndarray(int64, ndim=1)
        ``n + 1`` offsets of each request's prompt blocks in ``ident``.
    list_offsets : ndarray(int64, ndim=1)
        ``n + 1`` offsets of each request's hash_ids in ``hash_rank``.
    hash_rank : ndarray(int64, ndim=1)
        Each hash_ids entry's rank among the distinct hashes.
    block_size, trace_block : int
        Engine block and hash_ids block, tokens.
    unique_base : int
        Distinct hashes x ``trace_block``: the first identity past every pair.
    ident : ndarray(int64, ndim=1)
        Out, per prompt block.
    """
    for k in range(offset.shape[0] - 1):
        first_hash = list_offsets[k]
        num_hashes = list_offsets[k + 1] - first_hash
        m = 0
        m_start = 0  # trace block m's first token (m advanced as e grows: no division per block)
        for b in range(offset[k], offset[k + 1]):
            end = (b - offset[k] + 1) * block_size
            while end > m_start + trace_block:
                m += 1
                m_start += trace_block
            if m < num_hashes:
                ident[b] = hash_rank[first_hash + m] * trace_block + end - m_start - 1
            else:
                ident[b] = unique_base + b
