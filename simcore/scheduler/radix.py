"""The node tree of SGLang's radix cache, Python side (``simcore.scheduler.radix_tree_nb``).

The tree gives the block model's results only when the identities are
tree-shaped; :func:`tree_shaped` decides, :func:`radix_prefix_cache` builds the
state.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from simcore.scheduler.kv_nb import HDR_BLOCK_SLOT, HDR_GENERATION, allocate_prefix_cache
from simcore.scheduler.radix_ident_nb import (
    I_BLOCK,
    I_HASHED,
    I_LISTS,
    I_MARK,
    I_OFFSET,
    I_RANKS,
    I_TRACE,
    I_UNIQUE,
    IHEADER,
    materialise_identities_nb,
)
from simcore.scheduler.radix_tree_nb import NODE_WIDTH, QUEUE_WIDTH, THEADER
from simcore.workload.api import RequestTable


def _hash_ranks(requests: RequestTable) -> tuple[np.ndarray, np.ndarray, int]:
    """The ``hash_ids`` lists as ``n + 1`` offsets, each entry's rank among the distinct hashes, and their number."""
    hash_ids = requests.hash_ids
    if isinstance(hash_ids, pa.ChunkedArray):
        hash_ids = hash_ids.combine_chunks()
    offsets = hash_ids.offsets.to_numpy().astype(np.int64)
    values = hash_ids.flatten().to_numpy().astype(np.int64)
    distinct, rank = np.unique(values, return_inverse=True)
    return offsets - offsets[0], rank.reshape(-1).astype(np.int64), distinct.shape[0]


def radix_trace_identities(requests: RequestTable, offset: np.ndarray, block_size: int,
                           trace_block_size: int | None) -> np.ndarray:
    """The identities of every block a request can hold, from ``hash_ids``,
    one per block (:func:`radix_trace_runs` written out).

    Parameters
    ----------
    requests : RequestTable
        With ``hash_ids``.
    offset : ndarray(int64, ndim=1)
        ``n + 1`` offsets of each request's ``ceil((input + output) / bs)`` blocks.
    block_size : int
        Engine KV block size, tokens.
    trace_block_size : int or None
        Tokens per ``hash_ids`` entry (``workload.block_size``; None: 512).

    Returns
    -------
    ndarray(int64, ndim=1)
    """
    ident = np.empty(int(offset[-1]), dtype=np.int64)
    materialise_identities_nb(radix_trace_runs(requests, offset, block_size, trace_block_size), ident)
    return ident


def radix_trace_runs(requests: RequestTable, offset: np.ndarray, block_size: int,
                     trace_block_size: int | None) -> np.ndarray:
    """The identities of every block a request can hold, from ``hash_ids``, in
    the computed form of :mod:`simcore.scheduler.radix_ident_nb`: a few int64
    per request and per ``hash_ids`` entry instead of one per block.

    Complete prompt block j of request k ends at token ``e = (j+1)·bs`` in
    trace block ``m = (e - 1) div T``; while ``m`` is within its hash_ids its
    identity is ``hash rank x T + e - m·T - 1``
    (:func:`simcore.scheduler.kv_nb.trace_block_identities_nb`'s); every other
    block (past the hash_ids, a partial one, a generated one) is unique to it:
    distinct hashes x ``T`` + its flat index.

    Parameters
    ----------
    requests, offset, block_size, trace_block_size
        As :func:`radix_trace_identities`.

    Returns
    -------
    ndarray(int64, ndim=1)
    """
    list_offsets, rank, distinct = _hash_ranks(requests)
    trace_block = trace_block_size or 512
    hashed = np.minimum(np.asarray(requests.input_tokens, dtype=np.int64) // block_size,
                        np.diff(list_offsets) * trace_block // block_size)
    parts = [offset, hashed, list_offsets, rank]
    bases = IHEADER + np.concatenate([[0], np.cumsum([part.shape[0] for part in parts])])
    ident = np.empty(int(bases[-1]), dtype=np.int64)
    ident[[I_MARK, I_BLOCK, I_TRACE, I_UNIQUE]] = [-1, block_size, trace_block, distinct * trace_block]
    ident[[I_OFFSET, I_HASHED, I_LISTS, I_RANKS]] = bases[:4]
    for part, start in zip(parts, bases[:4]):
        ident[start : start + part.shape[0]] = part
    return ident


def tree_shaped(requests: RequestTable, router_policy: str) -> bool:
    """Whether the radix cache of these requests can run as a node tree.

    Positional identities (synthetic prefixes, sessions) are tree-shaped by
    construction.  ``hash_ids`` are when each hash always comes at the same
    position after the same hash (prefix-chained, as Mooncake's): a block's
    identity, a hash and an offset, then stands for the blocks before it.
    The ``prefix_aware`` router reads the block model's map, so it keeps that.

    Parameters
    ----------
    requests : RequestTable
    router_policy : str
        ``engine.router.policy``.

    Returns
    -------
    bool
    """
    if router_policy == "prefix_aware":
        return False
    if requests.hash_ids is None:
        return True
    offsets, rank, _ = _hash_ranks(requests)
    if rank.shape[0] == 0:
        return True
    row = np.repeat(np.arange(offsets.shape[0] - 1), np.diff(offsets))
    position = np.arange(rank.shape[0]) - offsets[:-1][row]
    previous = np.where(position > 0, np.roll(rank, 1), -1)
    for per_entry in (position, previous):
        seen = np.empty(int(rank.max()) + 1, dtype=np.int64)
        seen[rank] = per_entry  # one occurrence's value per hash: all must agree
        if not np.array_equal(seen[rank], per_entry):
            return False
    return True


def radix_prefix_cache(num_slots: int, num_ranks: int, ident_offset: np.ndarray, ident: np.ndarray,
                       offload_tail: np.ndarray, num_blocks: np.ndarray, extra: int = 0) -> tuple:
    """The prefix-cache state with an empty node tree (``kv_nb``'s map and slots minimal).

    The tree takes the place of ``kv_nb``'s block slots, which it does not use
    (:func:`simcore.scheduler.radix_tree_nb.tree_nb`); its nodes and free
    stack come last and are written only as nodes are used.  A negative
    generation counter marks the state.

    Parameters
    ----------
    num_slots : int
        Blocks over all ranks (a bound on the nodes).
    num_ranks : int
        Global ranks.
    ident_offset, ident : ndarray(int64, ndim=1)
        As for :func:`simcore.scheduler.kv_nb.allocate_prefix_cache`.
    offload_tail : ndarray(int64, ndim=1)
        The (empty) CPU tier's state, at the state's tail as always.
    num_blocks : ndarray(int64, ndim=1)
        KV blocks per global rank.
    extra : int
        Words left after the free stack, unwritten (``simcore.scheduler.kv_tree``).

    Returns
    -------
    tuple of ndarray(int64, ndim=1)
        ``(state, ident)``.
    """
    n = ident_offset.shape[0] - 1
    bits = max(4, int(2 * max(num_slots, 1) - 1).bit_length())
    sizes = [2 << bits, QUEUE_WIDTH * num_ranks, n, NODE_WIDTH * num_slots, num_slots, extra]
    bases = THEADER + np.concatenate([[0], np.cumsum(sizes)])
    # kv_nb sizes its block slots by the identities: an unwritten array of the tree's size.
    state, _ = allocate_prefix_cache(1, num_ranks, ident_offset, np.empty(int(bases[-1]), dtype=np.int64),
                                     tail=offload_tail)
    tree = state[state[HDR_BLOCK_SLOT] :]
    # clock, map mask and shift, unused nodes, the parts, free-stack height between
    tree[:THEADER] = [0, (1 << bits) - 1, 64 - bits, 0, bases[0], bases[3], bases[4], 0, bases[1], bases[2]]
    tree[bases[0] : bases[1]] = -1
    queues = tree[bases[1] : bases[2]].reshape(num_ranks, QUEUE_WIDTH)
    queues[:, :3] = [-1, -1, 0]  # head, tail, unlocked blocks
    queues[:, 3] = num_blocks
    tree[bases[2] : bases[3]] = -1
    state[HDR_GENERATION] = -1
    return state, np.ascontiguousarray(ident, dtype=np.int64)
