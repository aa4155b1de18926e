"""Block identities of the radix tree, materialised or computed from ``hash_ids`` (docs/prefix-caching.md).

Contract: ``@njit(cache=True)`` functions that the node tree of
``simcore.scheduler.radix_tree_nb`` reads identities through, over the
prefix cache's identity array ``ident`` in one of two forms:

* materialised: one identity (>= 0) per block a request can hold, request k's
  at ``[offset[k], offset[k+1])`` (:func:`simcore.scheduler.prefix.radix_block_identities`);
* computed (``ident[0] < 0``), for traces with ``hash_ids``
  (:func:`simcore.scheduler.radix.radix_trace_runs`): per request its block
  offset, its hashed blocks and where its hash ranks start, and the ranks.
  Block j of request k, ending at token ``e = (j+1)·bs`` in trace block
  ``m = (e - 1) div T``, has, while ``j`` is below its hashed blocks, the
  identity ``rank[m] x T + e - m·T - 1``, else ``unique_base + offset[k] + j``
  (:func:`materialise_identities_nb` writes them out for the node-per-block
  kernel).

Two requests' blocks at one depth within one trace block are equal exactly
when that trace block's hash ranks are, so a run is compared one trace block
at a time; an unhashed block equals only itself.
"""

from __future__ import annotations

from numba import njit

# Header of the computed form.
I_MARK = 0  # -1: computed (a materialised identity is >= 0)
I_BLOCK = 1  # engine block size, tokens
I_TRACE = 2  # tokens per hash_ids entry
I_UNIQUE = 3  # past every hashed identity
I_OFFSET = 4  # where the n + 1 block offsets start
I_HASHED = 5  # ... the n hashed-block counts
I_LISTS = 6  # ... the n + 1 offsets into the ranks
I_RANKS = 7  # ... the hash ranks
IHEADER = 8


@njit(cache=True, inline="always")
def _computed_nb(ident):
    return ident.shape[0] > 0 and ident[I_MARK] < 0


@njit(cache=True, inline="always")
def _hashed_identity_nb(rank, end, m, trace_block):
    """A block ending at token ``end`` inside trace block m of hash ``rank``: the pair (hash, end - m·T), numbered."""
    return rank * trace_block + end - m * trace_block - 1


@njit(cache=True)
def ident_at_nb(ident, k, b):
    """The identity of block ``b`` (an index in the flat block order) of request k.

    Parameters
    ----------
    ident : ndarray(int64, ndim=1)
        The identities, materialised or computed.
    k : int
        The request holding the block.
    b : int
        Its flat index: ``offset[k]`` + its index in the request.

    Returns
    -------
    int
    """
    if not _computed_nb(ident):
        return ident[b]
    j = b - ident[ident[I_OFFSET] + k]
    if j >= ident[ident[I_HASHED] + k]:
        return ident[I_UNIQUE] + b
    trace_block = ident[I_TRACE]
    end = (j + 1) * ident[I_BLOCK]
    m = (end - 1) // trace_block
    return _hashed_identity_nb(ident[ident[I_RANKS] + ident[ident[I_LISTS] + k] + m], end, m, trace_block)


@njit(cache=True)
def same_run_nb(ident, a, src, k, here, span):
    """How many of the ``span`` blocks from ``src`` (request a's) and from
    ``here`` (request k's, at the same depth) are equal one by one, up to the
    first that differs; their first blocks are equal.

    Parameters
    ----------
    ident : ndarray(int64, ndim=1)
        The identities, materialised or computed.
    a, src : int
        Request a and the flat index of its first block of the run.
    k, here : int
        Request k and the flat index of its first block of the run.
    span : int
        Blocks compared, >= 1.

    Returns
    -------
    int
        Leading equal blocks, >= 1.
    """
    if not _computed_nb(ident):
        matched = 1
        while matched < span and ident[src + matched] == ident[here + matched]:
            matched += 1
        return matched
    if a == k:
        return span
    depth = here - ident[ident[I_OFFSET] + k]
    stop = min(depth + span, ident[ident[I_HASHED] + a], ident[ident[I_HASHED] + k])
    block_size = ident[I_BLOCK]
    trace_block = ident[I_TRACE]
    ranks_a = ident[I_RANKS] + ident[ident[I_LISTS] + a]
    ranks_k = ident[I_RANKS] + ident[ident[I_LISTS] + k]
    j = depth + 1
    while j < stop:
        m = ((j + 1) * block_size - 1) // trace_block
        if ident[ranks_a + m] != ident[ranks_k + m]:
            return j - depth
        j = (m + 1) * trace_block // block_size  # the first block ending in trace block m + 1
    return stop - depth  # past the hashed blocks of either, a block is its own request's


@njit(cache=True)
def materialise_identities_nb(ident, out):
    """Write the computed identities ``ident`` out, one per block, in one pass.

    Parameters
    ----------
    ident : ndarray(int64, ndim=1)
        The computed form.
    out : ndarray(int64, ndim=1)
        Out, per block in the flat order (the offsets' last value of them).
    """
    block_size = ident[I_BLOCK]
    trace_block = ident[I_TRACE]
    offset = ident[I_OFFSET]
    n = ident[I_HASHED] - offset - 1  # the n + 1 offsets come first
    for k in range(n):
        first = ident[offset + k]
        ranks = ident[I_RANKS] + ident[ident[I_LISTS] + k]
        hashed = ident[ident[I_HASHED] + k]
        m = 0
        bound = trace_block  # end of trace block m, tokens (m advances with the blocks: no division)
        for j in range(hashed):
            end = (j + 1) * block_size
            while end > bound:
                m += 1
                bound += trace_block
            out[first + j] = _hashed_identity_nb(ident[ranks + m], end, m, trace_block)
        for b in range(first + hashed, ident[offset + k + 1]):
            out[b] = ident[I_UNIQUE] + b
