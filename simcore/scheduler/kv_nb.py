"""KV-cache kernels for automatic prefix caching (docs/prefix-caching.md).

Contract: ``@njit(cache=True)`` functions over flat int64 arrays.  The cache
state is one tuple ``pc`` of int64 arrays (indices ``PC_*``):

* a linear-probing hash map from ``identity x num_ranks + rank`` to a slot;
* per slot (an identity-bearing physical block): its map key, reference count
  and links in its rank's LRU queue of cached (unreferenced) blocks;
* per rank: LRU head, tail and length (the cached blocks);
* per request: which slot backs each settled prompt block (-1: anonymous) and
  how many prompt blocks are settled (hit or registered);
* per request prompt-block identities (dense ids, ragged by ``offset``).

``blocks_used[g]`` counts in-use blocks once (a shared slot once, however
many requests reference it); cached blocks are free for capacity checks and are
evicted, LRU head first, only when an allocation finds no truly free block.
"""

from __future__ import annotations

import numpy as np
from numba import njit

PC_MAP_KEYS = 0
PC_MAP_SLOTS = 1
PC_SLOT_KEY = 2
PC_SLOT_REF = 3
PC_SLOT_PREV = 4
PC_SLOT_NEXT = 5
PC_FREE_SLOTS = 6  # stack of unused slot indices; its height is PC_SCALARS[0]
PC_SCALARS = 7
PC_LRU_HEAD = 8
PC_LRU_TAIL = 9
PC_CACHED = 10
PC_BLOCK_SLOT = 11
PC_SETTLED = 12
PC_IDENT_OFFSET = 13
PC_IDENT = 14

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def allocate_prefix_cache(num_slots: int, num_ranks: int, ident_offset: np.ndarray, ident: np.ndarray):
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
        Dense prompt-block identities, request by request.

    Returns
    -------
    tuple of ndarray(int64, ndim=1)
        The 15 state arrays at the ``PC_*`` indices (empty map, all slots free).
    """
    capacity = 1 << max(4, int(2 * max(num_slots, 1) - 1).bit_length())
    n = ident_offset.shape[0] - 1
    return (
        np.full(capacity, -1, dtype=np.int64),
        np.zeros(capacity, dtype=np.int64),
        np.full(num_slots, -1, dtype=np.int64),
        np.zeros(num_slots, dtype=np.int64),
        np.full(num_slots, -1, dtype=np.int64),
        np.full(num_slots, -1, dtype=np.int64),
        np.arange(num_slots - 1, -1, -1, dtype=np.int64),
        np.array([num_slots], dtype=np.int64),
        np.full(num_ranks, -1, dtype=np.int64),
        np.full(num_ranks, -1, dtype=np.int64),
        np.zeros(num_ranks, dtype=np.int64),
        np.full(max(ident.shape[0], 1), -1, dtype=np.int64),
        np.zeros(max(n, 1), dtype=np.int64),
        np.ascontiguousarray(ident_offset, dtype=np.int64),
        np.ascontiguousarray(ident, dtype=np.int64),
    )


@njit(cache=True)
def _home_nb(key, mask):
    return np.int64((np.uint64(key) * _GOLDEN) >> np.uint64(20)) & mask


@njit(cache=True)
def _map_find_nb(keys, slots, key):
    mask = keys.shape[0] - 1
    i = _home_nb(key, mask)
    while keys[i] != -1:
        if keys[i] == key:
            return slots[i]
        i = (i + 1) & mask
    return -1


@njit(cache=True)
def _map_insert_nb(keys, slots, key, slot):
    mask = keys.shape[0] - 1
    i = _home_nb(key, mask)
    while keys[i] != -1:
        i = (i + 1) & mask
    keys[i] = key
    slots[i] = slot


@njit(cache=True)
def _map_delete_nb(keys, slots, key):
    """Remove ``key``, shifting later entries of its probe run back (no tombstones)."""
    mask = keys.shape[0] - 1
    i = _home_nb(key, mask)
    while keys[i] != key:
        i = (i + 1) & mask
    j = i
    while True:
        j = (j + 1) & mask
        if keys[j] == -1:
            break
        home = _home_nb(keys[j], mask)
        # Move entry j into the hole at i unless its home lies cyclically in (i, j].
        if (i < j and (home <= i or home > j)) or (i > j and home <= i and home > j):
            keys[i] = keys[j]
            slots[i] = slots[j]
            i = j
    keys[i] = -1


@njit(cache=True)
def _lru_remove_nb(pc, g, slot):
    prev, nxt = pc[PC_SLOT_PREV], pc[PC_SLOT_NEXT]
    if prev[slot] >= 0:
        nxt[prev[slot]] = nxt[slot]
    else:
        pc[PC_LRU_HEAD][g] = nxt[slot]
    if nxt[slot] >= 0:
        prev[nxt[slot]] = prev[slot]
    else:
        pc[PC_LRU_TAIL][g] = prev[slot]
    prev[slot] = -1
    nxt[slot] = -1
    pc[PC_CACHED][g] -= 1


@njit(cache=True)
def _lru_push_tail_nb(pc, g, slot):
    prev, nxt = pc[PC_SLOT_PREV], pc[PC_SLOT_NEXT]
    tail = pc[PC_LRU_TAIL][g]
    prev[slot] = tail
    nxt[slot] = -1
    if tail >= 0:
        nxt[tail] = slot
    else:
        pc[PC_LRU_HEAD][g] = slot
    pc[PC_LRU_TAIL][g] = slot
    pc[PC_CACHED][g] += 1


@njit(cache=True)
def kv_allocate_nb(pc, g, count, blocks_used, num_blocks):
    """Take ``count`` blocks on rank g, evicting cached blocks (LRU head first)
    when the truly free ones do not suffice.

    Parameters
    ----------
    pc : tuple of ndarray(int64, ndim=1)
        The prefix-cache state (``PC_*`` indices), mutated in place.
    g : int
        Global rank.
    count : int
        Blocks to take.
    blocks_used : ndarray(int64, ndim=1)
        In-use blocks per rank; ``blocks_used[g]`` grows by ``count``.
    num_blocks : int
        KV blocks of rank g.
    """
    shortfall = blocks_used[g] + count + pc[PC_CACHED][g] - num_blocks
    for _ in range(shortfall):
        slot = pc[PC_LRU_HEAD][g]
        _lru_remove_nb(pc, g, slot)
        _map_delete_nb(pc[PC_MAP_KEYS], pc[PC_MAP_SLOTS], pc[PC_SLOT_KEY][slot])
        top = pc[PC_SCALARS][0]
        pc[PC_FREE_SLOTS][top] = slot
        pc[PC_SCALARS][0] = top + 1
    blocks_used[g] += count


@njit(cache=True)
def kv_hits_nb(pc, g, num_ranks, k, known, block_size):
    """Leading complete prompt blocks of request k resident on rank g, with at
    least the last known token left to compute; and how many of them are cached.

    The slots found are noted in request k's block-slot entries (beyond its
    settled blocks, which a waiting request has none of), for
    :func:`kv_take_hits_nb` to take without looking them up again.

    Parameters
    ----------
    pc : tuple of ndarray(int64, ndim=1)
        The prefix-cache state (read only but request k's block-slot entries).
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
    offset = pc[PC_IDENT_OFFSET]
    ident = pc[PC_IDENT]
    limit = min(offset[k + 1] - offset[k], (known - 1) // block_size)
    hits = 0
    cached = 0
    while hits < limit:
        slot = _map_find_nb(pc[PC_MAP_KEYS], pc[PC_MAP_SLOTS], ident[offset[k] + hits] * num_ranks + g)
        if slot < 0:
            break
        if pc[PC_SLOT_REF][slot] == 0:
            cached += 1
        pc[PC_BLOCK_SLOT][offset[k] + hits] = slot
        hits += 1
    return hits, cached


@njit(cache=True)
def kv_take_hits_nb(pc, g, k, hits, blocks_used):
    """Reference request k's first ``hits`` prompt blocks (resident on rank g).

    Their slots are those :func:`kv_hits_nb` just noted (the cache has not
    changed since).

    Parameters
    ----------
    pc : tuple of ndarray(int64, ndim=1)
        The prefix-cache state (``PC_*`` indices), mutated in place.
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
    offset = pc[PC_IDENT_OFFSET]
    ref = pc[PC_SLOT_REF]
    for j in range(hits):
        slot = pc[PC_BLOCK_SLOT][offset[k] + j]
        if ref[slot] == 0:
            _lru_remove_nb(pc, g, slot)
            blocks_used[g] += 1
        ref[slot] += 1
    pc[PC_SETTLED][k] = hits


@njit(cache=True)
def kv_register_nb(pc, g, num_ranks, k, tokens, block_size):
    """Give identities to request k's prompt blocks completed by ``tokens``
    computed tokens, in block order, unless the identity is already resident.

    Parameters
    ----------
    pc : tuple of ndarray(int64, ndim=1)
        The prefix-cache state (``PC_*`` indices), mutated in place.
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
    offset = pc[PC_IDENT_OFFSET]
    ident = pc[PC_IDENT]
    complete = min(tokens // block_size, offset[k + 1] - offset[k])
    for j in range(pc[PC_SETTLED][k], complete):
        key = ident[offset[k] + j] * num_ranks + g
        slot = -1
        if _map_find_nb(pc[PC_MAP_KEYS], pc[PC_MAP_SLOTS], key) < 0:
            top = pc[PC_SCALARS][0] - 1
            slot = pc[PC_FREE_SLOTS][top]
            pc[PC_SCALARS][0] = top
            pc[PC_SLOT_KEY][slot] = key
            pc[PC_SLOT_REF][slot] = 1
            _map_insert_nb(pc[PC_MAP_KEYS], pc[PC_MAP_SLOTS], key, slot)
        pc[PC_BLOCK_SLOT][offset[k] + j] = slot
    if complete > pc[PC_SETTLED][k]:
        pc[PC_SETTLED][k] = complete


@njit(cache=True)
def kv_release_nb(pc, g, k, held, blocks_used):
    """Drop request k's blocks on rank g in reverse block order: identity-bearing
    blocks whose last reference goes join the LRU tail, the rest become free.

    Parameters
    ----------
    pc : tuple of ndarray(int64, ndim=1)
        The prefix-cache state (``PC_*`` indices), mutated in place.
    g : int
        Global rank.
    k : int
        Request index.
    held : ndarray(int64, ndim=1)
        Blocks held per request; ``held[k]`` is set to 0.
    blocks_used : ndarray(int64, ndim=1)
        In-use blocks per rank; ``blocks_used[g]`` shrinks accordingly.
    """
    offset = pc[PC_IDENT_OFFSET]
    ref = pc[PC_SLOT_REF]
    settled = pc[PC_SETTLED][k]
    anonymous = held[k]
    for j in range(settled - 1, -1, -1):
        slot = pc[PC_BLOCK_SLOT][offset[k] + j]
        if slot >= 0:
            anonymous -= 1
            ref[slot] -= 1
            if ref[slot] == 0:
                blocks_used[g] -= 1
                _lru_push_tail_nb(pc, g, slot)
    blocks_used[g] -= anonymous
    pc[PC_SETTLED][k] = 0
    held[k] = 0
