"""SGLang's radix cache at block granularity (docs/prefix-caching.md, ``sglang``).

Contract: ``@njit(cache=True)`` functions over the prefix-cache state of
``simcore.scheduler.kv_nb`` (one int64 array plus the identities), whose map,
slots, free stack, LRU queues and per-request block slots it shares.  The
identities cover every block a request can hold (its complete prompt blocks
from the workload, the rest unique to it), because SGLang inserts a finished
request's generated tokens too.

With prefix-chained identities a block's resident ancestors are its tree path,
so the radix tree is the map itself: a node per block.  SGLang evicts the
unlocked leaf with the oldest ``last_access_time``; a node's time is never older
than its children's (every access touches the whole path), so the order is the
one of all unlocked blocks by (access stamp, deeper first), the head of each
rank's LRU queue always being a leaf.  Here the slot fields of the vLLM memo
hold the stamp (``S_STAMP``, from the header's generation counter used as the
access clock) and the depth (``S_POSITION``), and the queue is kept sorted by
them: a block unlocked by a retraction keeps its older stamp and is inserted
in place, every other one joins the tail.

When the identities are tree-shaped (each at one depth after one sequence of
identities: prefix-chained ``hash_ids``, synthetic prefixes, sessions) the state
holds a tree of nodes of many blocks instead (``simcore.scheduler.radix_tree_nb``,
the same results, its cost per node rather than per block), marked by a
negative generation counter; the functions below dispatch on it.  A state
without identities (prefix caching off) takes the block path and has no tree.
"""

from __future__ import annotations

from numba import njit

from simcore.scheduler.kv_nb import (
    HDR_BLOCK_SLOT,
    HDR_FREE,
    HDR_FREE_TOP,
    HDR_GENERATION,
    HDR_OFFSET,
    HDR_RANKS,
    HDR_SETTLED,
    HDR_SLOTS,
    R_CACHED,
    R_HEAD,
    R_TAIL,
    RANK_WIDTH,
    S_KEY,
    S_NEXT,
    S_POSITION,
    S_PREV,
    S_REF,
    S_STAMP,
    SLOT_WIDTH,
    _lru_push_tail_nb,
    _lru_remove_nb,
    _map_find_nb,
    _map_insert_nb,
    kv_take_hits_nb,
)
from simcore.scheduler.radix_tree_nb import (
    tree_insert_nb,
    tree_lock_nb,
    tree_match_nb,
    tree_release_nb,
)


@njit(cache=True)
def _touch_path_nb(s, rank, block_slot, depth):
    """Give the first ``depth`` blocks of a path a new access stamp (SGLang's
    ``last_access_time``); the unlocked ones move to the LRU tail, deepest first."""
    stamp = s[HDR_GENERATION] + 1
    s[HDR_GENERATION] = stamp
    slots = s[HDR_SLOTS]
    for j in range(depth - 1, -1, -1):
        slot = s[block_slot + j]
        at = slots + SLOT_WIDTH * slot
        s[at + S_STAMP] = stamp
        s[at + S_POSITION] = j
        if s[at + S_REF] == 0:
            _lru_remove_nb(s, rank, slot)
            _lru_push_tail_nb(s, rank, slot)


@njit(cache=True, inline="always")
def _has_tree_nb(s):
    """Whether the state holds the node tree (``radix_tree_nb``) rather than a node per block."""
    return s[HDR_GENERATION] < 0


@njit(cache=True)
def radix_match_nb(pc, g, num_ranks, k, known, block_size, blocks_used):
    """SGLang's ``match_prefix`` for request k on rank g: the leading resident
    blocks of its first ``known - 1`` tokens, whole blocks only; the matched
    path's access stamps are refreshed whether or not the request is admitted.

    The slots found are noted in request k's block-slot entries for
    :func:`simcore.scheduler.kv_nb.kv_take_hits_nb`.  The lookup is
    :func:`simcore.scheduler.kv_nb.kv_hits_nb`'s without its admission memo,
    whose slot fields hold the access stamps here.

    Parameters
    ----------
    pc : tuple of ndarray(int64, ndim=1)
        The prefix cache ``(state, ident)``; the state is mutated in place.
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
    blocks_used : ndarray(int64, ndim=1)
        In-use blocks per rank (read only).

    Returns
    -------
    hits : int
        Matched leading blocks, blocks.
    cached : int
        Of those, blocks unlocked (in the LRU queue), blocks.
    """
    if _has_tree_nb(pc[0]):
        return tree_match_nb(pc, g, num_ranks, k, known, block_size, blocks_used)
    s = pc[0]
    ident = pc[1]
    rank = s[HDR_RANKS] + RANK_WIDTH * g
    slots = s[HDR_SLOTS]
    first = s[s[HDR_OFFSET] + k]
    limit = min(s[s[HDR_OFFSET] + k + 1] - first, (known - 1) // block_size)
    block_slot = s[HDR_BLOCK_SLOT] + first
    hits = 0
    cached = 0
    while hits < limit:
        slot = _map_find_nb(s, ident[first + hits] * num_ranks + g)
        if slot < 0:
            break
        if s[slots + SLOT_WIDTH * slot + S_REF] == 0:
            cached += 1
        s[block_slot + hits] = slot
        hits += 1
    _touch_path_nb(s, rank, block_slot, hits)
    return hits, cached


@njit(cache=True)
def radix_insert_nb(pc, g, num_ranks, k, tokens, block_size, blocks_used):
    """SGLang's ``insert`` of request k's first ``tokens`` tokens (whole blocks)
    on rank g, as ``cache_unfinished_req`` / ``cache_finished_req`` do it.

    Blocks past the ones already in the tree join it in block order: a block
    whose identity is not resident takes it; one whose identity is resident is
    a duplicate, freed, and the request locks the resident block instead.  The
    request's whole path then gets a new access stamp.

    Parameters
    ----------
    pc : tuple of ndarray(int64, ndim=1)
        The prefix cache ``(state, ident)``; the state is mutated in place.
    g : int
        Global rank.
    num_ranks : int
        Global ranks.
    k : int
        Request index (holding a block for each of the first ``tokens`` tokens).
    tokens : int
        Tokens whose KV request k has computed, tokens.
    block_size : int
        Tokens per block.
    blocks_used : ndarray(int64, ndim=1)
        In-use blocks per rank; shrinks by the duplicates freed, grows by the
        unlocked resident blocks they lock.
    """
    if _has_tree_nb(pc[0]):
        tree_insert_nb(pc, g, num_ranks, k, tokens, block_size, blocks_used)
        return
    s = pc[0]
    ident = pc[1]
    rank = s[HDR_RANKS] + RANK_WIDTH * g
    slots = s[HDR_SLOTS]
    settled = s[HDR_SETTLED] + k
    first = s[s[HDR_OFFSET] + k]
    block_slot = s[HDR_BLOCK_SLOT] + first
    complete = min(tokens // block_size, s[s[HDR_OFFSET] + k + 1] - first)
    for j in range(s[settled], complete):
        key = ident[first + j] * num_ranks + g
        slot = _map_find_nb(s, key)
        if slot < 0:
            top = s[HDR_FREE_TOP] - 1
            slot = s[s[HDR_FREE] + top]
            s[HDR_FREE_TOP] = top
            s[slots + SLOT_WIDTH * slot + S_KEY] = key
            s[slots + SLOT_WIDTH * slot + S_REF] = 1
            _map_insert_nb(s, key, slot)
        else:
            at = slots + SLOT_WIDTH * slot
            if s[at + S_REF] == 0:
                _lru_remove_nb(s, rank, slot)
                blocks_used[g] += 1
            s[at + S_REF] += 1
            blocks_used[g] -= 1  # the request's own copy
        s[block_slot + j] = slot
    if complete > s[settled]:
        s[settled] = complete
    _touch_path_nb(s, rank, block_slot, s[settled])


@njit(cache=True)
def radix_release_nb(pc, g, k, held, blocks_used):
    """A retracted or finished request unlocks its tree blocks and frees the
    rest (SGLang ``release_req`` and ``cache_finished_req``: a retraction
    inserts nothing and refreshes no access stamp; a finish has just inserted).

    A tree block left unlocked joins the LRU queue at the place of its stamp
    (a finished request's, just refreshed: the tail).  Without a tree (prefix
    caching off) this frees ``held[k]``.

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
    if _has_tree_nb(pc[0]):
        tree_release_nb(pc, g, k, held, blocks_used)
        return
    s = pc[0]
    settled = s[HDR_SETTLED] + k
    private = held[k]
    if s[settled] > 0:
        rank = s[HDR_RANKS] + RANK_WIDTH * g
        slots = s[HDR_SLOTS]
        block_slot = s[HDR_BLOCK_SLOT] + s[s[HDR_OFFSET] + k]
        for j in range(s[settled] - 1, -1, -1):
            slot = s[block_slot + j]
            private -= 1
            at = slots + SLOT_WIDTH * slot
            s[at + S_REF] -= 1
            if s[at + S_REF] == 0:
                blocks_used[g] -= 1
                _lru_insert_in_place_nb(s, rank, slot)
        s[settled] = 0
    blocks_used[g] -= private
    held[k] = 0


@njit(cache=True)
def _lru_insert_in_place_nb(s, rank, slot):
    """Insert ``slot`` into the rank's LRU queue, kept sorted by (stamp, deeper first)."""
    slots = s[HDR_SLOTS]
    stamp = s[slots + SLOT_WIDTH * slot + S_STAMP]
    depth = s[slots + SLOT_WIDTH * slot + S_POSITION]
    after = s[rank + R_TAIL]
    while after >= 0:
        other = slots + SLOT_WIDTH * after
        if s[other + S_STAMP] < stamp or (s[other + S_STAMP] == stamp and s[other + S_POSITION] >= depth):
            break
        after = s[other + S_PREV]
    if after == s[rank + R_TAIL]:
        _lru_push_tail_nb(s, rank, slot)
        return
    # Between ``after`` (-1: the head) and its successor.
    at = slots + SLOT_WIDTH * slot
    nxt = s[rank + R_HEAD] if after < 0 else s[slots + SLOT_WIDTH * after + S_NEXT]
    s[at + S_PREV] = after
    s[at + S_NEXT] = nxt
    s[slots + SLOT_WIDTH * nxt + S_PREV] = slot
    if after >= 0:
        s[slots + SLOT_WIDTH * after + S_NEXT] = slot
    else:
        s[rank + R_HEAD] = slot
    s[rank + R_CACHED] += 1


@njit(cache=True, inline="always")
def radix_lock_nb(pc, g, k, hits, blocks_used):
    """An admitted request locks the ``hits`` blocks its last match found
    (SGLang's ``inc_lock_ref``); the unlocked ones leave the eviction order.

    Parameters
    ----------
    pc : tuple of ndarray(int64, ndim=1)
        The prefix cache ``(state, ident)``; the state is mutated in place.
    g : int
        Global rank.
    k : int
        Request index.
    hits : int
        Blocks :func:`radix_match_nb` found for request k last, blocks.
    blocks_used : ndarray(int64, ndim=1)
        In-use blocks per rank; grows by the unlocked blocks locked.
    """
    if _has_tree_nb(pc[0]):
        tree_lock_nb(pc, g, k, hits, blocks_used)
    else:
        kv_take_hits_nb(pc, g, k, hits, blocks_used)
