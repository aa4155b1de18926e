"""vLLM's prefix cache with a node per run of blocks (docs/prefix-caching.md, ``vllm``, "How it runs").

TensorRT-LLM's reuse (``trtllm``) is the same block model, called at other moments.


Contract: ``@njit(cache=True)`` functions over the prefix-cache state that
holds SGLang's node tree (``simcore.scheduler.radix_tree_nb``: its map keyed
by first identity x ranks + rank, node pool, split and queue of unlocked
nodes), with a part of its own after the tree (:mod:`simcore.scheduler.kv_tree`).
They give the results of ``simcore.scheduler.kv_nb``'s block model when the
identities are tree-shaped (an identity at one depth after one sequence of
identities): an identity is resident at most once, so a resident block's
identity is its path, and

* a node is a run of resident blocks of one path with one reference count:
  every operation on a path splits the node where it stops inside it;
* ``kv_nb``'s LRU queue holds whole nodes: a release pushes a request's
  blocks deepest first, so a node's blocks, released together, sit together,
  deepest nearest the head; an eviction shortens the head node from its
  deepest block (the queue and eviction of ``radix_tree_nb``, whose
  deferred eviction gives ``kv_allocate_nb``'s blocks: see its docstring);
* a request's referenced blocks are *runs* of nodes (its hits, then the
  blocks it registers), broken where it computed a block whose identity was
  resident already: that block stays anonymous (vLLM does not dedupe), and
  the blocks it registers after it start a new run.  Per request, the runs'
  (first depth, deepest node); within a run a node's parent is the node
  before it (set when the request found or made it; a split keeps it);
* a node made after an anonymous block (a run's first, below depth 0) may
  outlive the block before it, which its request does not hold: it is
  *detached*.  Only then can a block after a miss be resident (a node's
  first block whose predecessor is not), so a rank's registrations look up
  each block after a miss only while it has detached blocks.

Nothing else is per block: a lookup costs one map probe and a bisection per
node (equal identities at a depth mean equal paths up to it), a release one
step per node, an eviction one per node it empties.  A rank remembers its last
lookup while its tree's hits and references stay as they were: a blocked queue
head, asked again at every pass, is answered from it (``kv_nb``'s admission
memo, which follows evictions block by block, does more).
"""

from __future__ import annotations

from numba import njit

from simcore.scheduler.kv_nb import (
    HDR_OFFSET,
    HDR_SETTLED,
    _map_find_nb,
    kv_hits_nb,
    kv_register_nb,
    kv_release_nb,
    kv_take_hits_nb,
)
from simcore.scheduler.radix_nb import _has_tree_nb
from simcore.scheduler.radix_tree_nb import (
    N_DEPTH,
    N_LENGTH,
    N_PARENT,
    N_REF,
    N_SRC,
    N_STAMP,
    NODE_WIDTH,
    Q_BLOCKS,
    Q_CACHED,
    Q_TAIL,
    QUEUE_WIDTH,
    T_FREE,
    T_LAST,
    T_NODES,
    T_QUEUES,
    _evict_nb as _evict_tree_nb,
    _link_after_nb,
    _new_node_nb,
    _node_at_nb,
    _split_nb,
    _unlink_nb,
    tree_nb,
)

# N_STAMP (SGLang's access stamp, unused here) marks a detached node; a split's
# two parts keep the mark, so a rank counts its detached blocks, not nodes.
N_DETACHED = N_STAMP


# The vLLM part, after the nodes' free stack: the offsets of the runs' counts and
# of their lists, then a record per rank.
P_COUNTS = 0
P_RUNS = 1
P_RANKS = 2

V_DETACHED = 0  # blocks of detached nodes
V_VERSION = 1  # changes of the tree's hits or references on the rank
V_MEMO_REQUEST = 2  # the last lookup on the rank (-1: none), valid while the version holds:
V_MEMO_LIMIT = 3  # a blocked queue head is looked up again at every pass
V_MEMO_VERSION = 4
V_MEMO_HITS = 5
V_MEMO_CACHED = 6
V_MEMO_LAST = 7
V_WIDTH = 8


@njit(cache=True)
def _runs_part_nb(t):
    """Offset in the tree of its vLLM part."""
    return t[T_FREE] + (t[T_FREE] - t[T_NODES]) // NODE_WIDTH


@njit(cache=True)
def _runs_at_nb(s, t, part, k):
    """Offset in the tree of request k's runs, ``(first depth, deepest node)``
    pairs: ``prompt blocks + 1`` words, as two runs have an anonymous block between."""
    return t[part + P_RUNS] + s[s[HDR_OFFSET] + k] + k


@njit(cache=True)
def _evict_nb(t, q, r, g, blocks_used):
    """``radix_tree_nb``'s deferred eviction, counting the detached blocks it drops."""
    if blocks_used[g] + t[q + Q_CACHED] > t[q + Q_BLOCKS]:
        t[r + V_VERSION] += 1
        _evict_tree_nb(t, q, blocks_used, g, r + V_DETACHED)


@njit(cache=True)
def _follow_nb(t, q, ident, num_ranks, g, first, depth, limit):
    """``radix_tree_nb._follow_nb``, the match's end found by bisection.

    With tree-shaped identities, equal identities at one depth mean equal
    paths up to it, so a path matches a node up to the last block where their
    identities agree (a blocked queue head is looked up at every pass: a
    comparison per block would make each lookup per block again).
    """
    node = _map_find_nb(t, ident[first + depth] * num_ranks + g)
    if node < 0:
        return -1, 0
    at = _node_at_nb(t, node)
    length = t[at + N_LENGTH]
    src = t[at + N_SRC] - 1
    here = first + depth - 1
    matched = min(length, limit - depth)
    if ident[src + matched] != ident[here + matched]:
        low = 1  # the first identity is the key
        high = matched - 1
        while low < high:
            middle = (low + high + 1) >> 1
            if ident[src + middle] == ident[here + middle]:
                low = middle
            else:
                high = middle - 1
        matched = low
    if matched < length:
        node = _split_nb(t, q, ident, num_ranks, g, node, matched)
    return node, matched


@njit(cache=True)
def _context_nb(pc, g):
    """The tree, rank g's queue, the vLLM part and rank g's record (offsets in the tree)."""
    t = tree_nb(pc[0])
    part = _runs_part_nb(t)
    return t, t[T_QUEUES] + QUEUE_WIDTH * g, part, part + P_RANKS + V_WIDTH * g


@njit(cache=True)
def kv_tree_hits_nb(pc, g, num_ranks, k, known, block_size, blocks_used):
    """:func:`simcore.scheduler.kv_nb.kv_hits_nb` on the tree.

    The path found is noted (its deepest node; each node's parent set to the
    one before it) for :func:`kv_tree_take_hits_nb`.

    Parameters
    ----------
    pc, g, num_ranks, k, known, block_size
        As :func:`simcore.scheduler.kv_nb.kv_hits_nb`.
    blocks_used : ndarray(int64, ndim=1)
        In-use blocks per rank (read only).

    Returns
    -------
    hits, cached : int
        As :func:`simcore.scheduler.kv_nb.kv_hits_nb`.
    """
    s = pc[0]
    ident = pc[1]
    t, q, part, r = _context_nb(pc, g)
    _evict_nb(t, q, r, g, blocks_used)
    first = s[s[HDR_OFFSET] + k]
    limit = min(s[s[HDR_OFFSET] + k + 1] - first, (known - 1) // block_size)
    if t[r + V_MEMO_REQUEST] == k and t[r + V_MEMO_LIMIT] == limit and t[r + V_MEMO_VERSION] == t[r + V_VERSION]:
        t[t[T_LAST] + k] = t[r + V_MEMO_LAST]
        return t[r + V_MEMO_HITS], t[r + V_MEMO_CACHED]
    hits = 0
    cached = 0
    last = -1
    while hits < limit:
        node, matched = _follow_nb(t, q, ident, num_ranks, g, first, hits, limit)
        if node < 0:
            break
        at = _node_at_nb(t, node)
        t[at + N_PARENT] = last
        if t[at + N_REF] == 0:
            cached += matched
        last = node
        hits += matched
    t[t[T_LAST] + k] = last
    t[r + V_MEMO_REQUEST] = k
    t[r + V_MEMO_LIMIT] = limit
    t[r + V_MEMO_VERSION] = t[r + V_VERSION]
    t[r + V_MEMO_HITS] = hits
    t[r + V_MEMO_CACHED] = cached
    t[r + V_MEMO_LAST] = last
    return hits, cached


@njit(cache=True)
def kv_tree_take_hits_nb(pc, g, k, hits, blocks_used):
    """:func:`simcore.scheduler.kv_nb.kv_take_hits_nb` on the tree: request k
    references the path its last lookup found, its first run.

    Parameters
    ----------
    pc, g, k, hits, blocks_used
        As :func:`simcore.scheduler.kv_nb.kv_take_hits_nb`.
    """
    s = pc[0]
    t, q, part, r = _context_nb(pc, g)
    runs = _runs_at_nb(s, t, part, k)
    count = 0
    if hits > 0:
        t[r + V_VERSION] += 1
        deepest = t[t[T_LAST] + k]
        node = deepest
        while True:
            at = _node_at_nb(t, node)
            if t[at + N_REF] == 0:
                _unlink_nb(t, q, node)
                t[q + Q_CACHED] -= t[at + N_LENGTH]
                blocks_used[g] += t[at + N_LENGTH]
            t[at + N_REF] += 1
            if t[at + N_DEPTH] == 0:
                break
            node = t[at + N_PARENT]
        t[runs] = 0
        t[runs + 1] = deepest
        count = 1
    t[t[part + P_COUNTS] + k] = count
    s[s[HDR_SETTLED] + k] = hits


@njit(cache=True)
def _resume_nb(t, q, ident, num_ranks, g, first, depth, anonymous):
    """Make the block at ``depth`` of the path at ``first`` a node's first block
    if it is resident, when the request holds the block before it anonymously
    (``anonymous``: the node that held that block's identity last).

    That node still ending with it, the block after is a node's first or not
    resident.  Else the identity may have been registered again since, inside
    a node: the one holding the nearest identity before ``depth`` that is a
    map key is the only candidate (an identity is resident once).
    """
    if anonymous >= 0:
        at = _node_at_nb(t, anonymous)
        length = t[at + N_LENGTH]
        if length > 0 and t[at + N_DEPTH] + length == depth:
            if ident[t[at + N_SRC] + length - 1] == ident[first + depth - 1]:
                return
    a = depth - 1
    while a >= 0:
        node = _map_find_nb(t, ident[first + a] * num_ranks + g)
        if node >= 0:
            at = _node_at_nb(t, node)
            inside = depth - a
            if inside < t[at + N_LENGTH] and ident[t[at + N_SRC] + inside] == ident[first + depth]:
                _split_nb(t, q, ident, num_ranks, g, node, inside)
            return
        a -= 1


@njit(cache=True)
def kv_tree_register_nb(pc, g, num_ranks, k, tokens, block_size, blocks_used):
    """:func:`simcore.scheduler.kv_nb.kv_register_nb` on the tree.

    Blocks resident already stay anonymous; each stretch of the others
    becomes one node (split at a detached node's first block), which extends
    the request's last run if the block before it is the request's.

    Parameters
    ----------
    pc, g, num_ranks, k, tokens, block_size
        As :func:`simcore.scheduler.kv_nb.kv_register_nb`.
    blocks_used : ndarray(int64, ndim=1)
        In-use blocks per rank (read only).
    """
    s = pc[0]
    settled = s[HDR_SETTLED] + k
    first = s[s[HDR_OFFSET] + k]
    complete = min(tokens // block_size, s[s[HDR_OFFSET] + k + 1] - first)
    depth = s[settled]
    if complete <= depth:
        return
    ident = pc[1]
    t, q, part, r = _context_nb(pc, g)
    _evict_nb(t, q, r, g, blocks_used)
    t[r + V_VERSION] += 1
    runs = _runs_at_nb(s, t, part, k)
    counts = t[part + P_COUNTS] + k
    anonymous = t[T_LAST] + k  # the node holding the identity of the request's last anonymous block
    last = -1  # the request's node ending at depth (-1: none, it holds the block before anonymously)
    if t[counts] > 0:
        deepest = t[runs + 2 * t[counts] - 1]
        at = _node_at_nb(t, deepest)
        if t[at + N_DEPTH] + t[at + N_LENGTH] == depth:
            last = deepest
    if last < 0 and depth > 0:
        _resume_nb(t, q, ident, num_ranks, g, first, depth, t[anonymous])
    detached = r + V_DETACHED
    while depth < complete:
        node, matched = _follow_nb(t, q, ident, num_ranks, g, first, depth, complete)
        if node >= 0:  # resident already: the request's copies stay anonymous
            depth += matched
            t[anonymous] = node
            last = -1
            continue
        end = complete
        if t[detached] > 0:  # a detached node's first block may come before
            end = depth + 1
            while end < complete and _map_find_nb(t, ident[first + end] * num_ranks + g) < 0:
                end += 1
        node = _new_node_nb(t, last, depth, end - depth, first + depth, ident[first + depth] * num_ranks + g)
        at = _node_at_nb(t, node)
        t[at + N_REF] = 1
        if last < 0:  # a new run
            t[runs + 2 * t[counts]] = depth
            t[runs + 2 * t[counts] + 1] = node
            t[counts] += 1
            if depth > 0:
                t[at + N_DETACHED] = 1
                t[detached] += end - depth
        else:
            t[runs + 2 * t[counts] - 1] = node
        last = node
        depth = end
    s[settled] = complete


@njit(cache=True)
def kv_tree_release_nb(pc, g, k, held, blocks_used):
    """:func:`simcore.scheduler.kv_nb.kv_release_nb` on the tree: the runs from
    the deepest, each from its deepest node; a node whose last reference goes
    joins the queue's tail.

    Parameters
    ----------
    pc, g, k, held, blocks_used
        As :func:`simcore.scheduler.kv_nb.kv_release_nb`.
    """
    s = pc[0]
    t, q, part, r = _context_nb(pc, g)
    _evict_nb(t, q, r, g, blocks_used)  # before blocks_used shrinks: those blocks were gone already
    settled = s[HDR_SETTLED] + k
    referenced = 0
    if s[settled] > 0:
        t[r + V_VERSION] += 1
        runs = _runs_at_nb(s, t, part, k)
        counts = t[part + P_COUNTS] + k
        for r in range(t[counts] - 1, -1, -1):
            start = t[runs + 2 * r]
            node = t[runs + 2 * r + 1]
            while True:
                at = _node_at_nb(t, node)
                referenced += t[at + N_LENGTH]
                t[at + N_REF] -= 1
                if t[at + N_REF] == 0:
                    blocks_used[g] -= t[at + N_LENGTH]
                    t[q + Q_CACHED] += t[at + N_LENGTH]
                    _link_after_nb(t, q, node, t[q + Q_TAIL])
                if t[at + N_DEPTH] <= start:
                    break
                node = t[at + N_PARENT]
        t[counts] = 0
        s[settled] = 0
    blocks_used[g] -= held[k] - referenced
    held[k] = 0


# The prefix cache of the vllm and trtllm policies on either model: the tree
# when the state holds one (simcore.scheduler.kv_tree decides), else kv_nb's blocks.


@njit(cache=True, inline="always")
def prefix_hits_nb(pc, g, num_ranks, k, known, block_size, blocks_used):
    """:func:`simcore.scheduler.kv_nb.kv_hits_nb` or :func:`kv_tree_hits_nb`.

    Parameters
    ----------
    pc, g, num_ranks, k, known, block_size, blocks_used
        As :func:`kv_tree_hits_nb`.

    Returns
    -------
    hits, cached : int
        As :func:`simcore.scheduler.kv_nb.kv_hits_nb`.
    """
    if _has_tree_nb(pc[0]):
        return kv_tree_hits_nb(pc, g, num_ranks, k, known, block_size, blocks_used)
    return kv_hits_nb(pc, g, num_ranks, k, known, block_size)


@njit(cache=True, inline="always")
def prefix_take_hits_nb(pc, g, k, hits, blocks_used):
    """:func:`simcore.scheduler.kv_nb.kv_take_hits_nb` or :func:`kv_tree_take_hits_nb`.

    Parameters
    ----------
    pc, g, k, hits, blocks_used
        As :func:`kv_tree_take_hits_nb`.
    """
    if _has_tree_nb(pc[0]):
        kv_tree_take_hits_nb(pc, g, k, hits, blocks_used)
    else:
        kv_take_hits_nb(pc, g, k, hits, blocks_used)


@njit(cache=True, inline="always")
def prefix_register_nb(pc, g, num_ranks, k, tokens, block_size, blocks_used):
    """:func:`simcore.scheduler.kv_nb.kv_register_nb` or :func:`kv_tree_register_nb`.

    Parameters
    ----------
    pc, g, num_ranks, k, tokens, block_size, blocks_used
        As :func:`kv_tree_register_nb`.
    """
    if _has_tree_nb(pc[0]):
        kv_tree_register_nb(pc, g, num_ranks, k, tokens, block_size, blocks_used)
    else:
        kv_register_nb(pc, g, num_ranks, k, tokens, block_size)


@njit(cache=True, inline="always")
def prefix_release_nb(pc, g, k, held, blocks_used):
    """:func:`simcore.scheduler.kv_nb.kv_release_nb` or :func:`kv_tree_release_nb`.

    Parameters
    ----------
    pc, g, k, held, blocks_used
        As :func:`kv_tree_release_nb`.
    """
    if _has_tree_nb(pc[0]):
        kv_tree_release_nb(pc, g, k, held, blocks_used)
    else:
        kv_release_nb(pc, g, k, held, blocks_used)
