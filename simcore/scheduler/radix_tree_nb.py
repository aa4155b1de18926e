"""SGLang's radix cache with a node per run of blocks (docs/prefix-caching.md, ``sglang``).

Contract: ``@njit(cache=True)`` functions over the prefix-cache state of
``simcore.scheduler.kv_nb`` that holds this tree where its block slots would be (built by
:func:`simcore.scheduler.radix.radix_prefix_cache`).  They give the results of
the block-per-node model of ``simcore.scheduler.radix_nb`` (which dispatches
here) when the identities are *tree-shaped*: an identity occurs only at one
depth and after one sequence of identities, so that the resident blocks of a
rank form a tree and a block's identity is its path.  Then:

* a node is a run of blocks ``[depth, depth + length)`` of one path, whose
  identities are those of a request that took them (its ``owner``), at
  ``src`` in the flat block order (read only, so any later request passing
  through compares its own identities with them; the identities are
  materialised or computed from ``hash_ids``: ``simcore.scheduler.radix_ident_nb``);
* the map (``kv_nb``'s, over this tail's header) keys a node by the identity
  of its first block and rank; a match or an insert looks up the block after
  its path, compares identities along the node found and splits it where the
  request's path ends inside it (SGLang's ``_split_node``);
* the blocks of a node share one lock count and one access stamp (every access
  touches a whole path, splitting the node where the path ends), so the
  eviction order of the block model (the unlocked block with the oldest stamp,
  the deeper first) is the order of the unlocked nodes by (stamp, deeper last
  block first), each node's blocks from its deepest; a rank keeps its unlocked
  nodes in that order in a queue, evicts from its head and shortens a node
  block by block (its first block, and so its key, stays).

Allocations are ``kv_nb.kv_allocate_nb``'s, which evicts nothing here (the
tree's unlocked blocks are not in its queues): the blocks an allocation takes
beyond the free ones are evicted by the next tree operation on the rank, before
it reads or changes the tree, from the queue as the allocation left it, which
is the same blocks.

Nothing here is per block: a match or an insert costs one map lookup and one
comparison loop per node it passes, a lock, a touch or a release one step per
node of the path, an eviction one step per node it empties.
"""

from __future__ import annotations

from numba import njit

from simcore.scheduler.kv_nb import (
    HDR_BLOCK_SLOT,
    HDR_MAP,
    HDR_MAP_MASK,
    HDR_MAP_SHIFT,
    HDR_OFFSET,
    HDR_SETTLED,
    _map_delete_nb,
    _map_find_nb,
    _map_insert_nb,
)
from simcore.scheduler.radix_ident_nb import ident_at_nb, same_run_nb

# Header of the tree (the map's mask, shift and offset where kv_nb's map
# functions read them).
T_CLOCK = 0  # access counter (SGLang's last_access_time)
T_MAP_MASK = HDR_MAP_MASK
T_MAP_SHIFT = HDR_MAP_SHIFT
T_UNUSED = 3  # nodes never used yet start here
T_MAP = HDR_MAP
T_NODES = 5
T_FREE = 6
T_FREE_TOP = 7
T_QUEUES = 8
T_LAST = 9  # per request, the last node of its tree path (-1: none)
THEADER = 10

N_PARENT = 0
N_DEPTH = 1  # of its first block
N_LENGTH = 2
N_SRC = 3  # index of its first block's identity
N_REF = 4
N_STAMP = 5
N_PREV = 6  # links in the rank's queue of unlocked nodes
N_NEXT = 7
N_KEY = 8  # map key: first identity x ranks + rank
N_OWNER = 9  # the request whose identities src indexes
# The access clock when the node's blocks joined the tree (a split's two parts keep it): the
# order in which SGLang's ``children`` dict received a node's children, read by
# ``simcore.scheduler.dfs_weight_nb`` (SGLang ``dfs-weight``), which also keeps its
# per-sort count of waiting requests in N_WEIGHT (0 between sorts).
N_BIRTH = 10
N_WEIGHT = 11
NODE_WIDTH = 12

Q_HEAD = 0
Q_TAIL = 1
Q_CACHED = 2  # unlocked blocks
Q_BLOCKS = 3  # the rank's KV blocks
QUEUE_WIDTH = 4

assert (T_MAP_MASK, T_MAP_SHIFT, T_MAP) == (1, 2, 4)


@njit(cache=True)
def tree_nb(s):
    """The tree: the state's part where ``kv_nb`` keeps its block slots, unused with a tree.

    Parameters
    ----------
    s : ndarray(int64, ndim=1)
        The prefix-cache state.

    Returns
    -------
    ndarray(int64, ndim=1)
        A view of the tree's part.
    """
    return s[s[HDR_BLOCK_SLOT]:]


@njit(cache=True)
def _node_at_nb(t, node):
    return t[T_NODES] + NODE_WIDTH * node


@njit(cache=True)
def _before_nb(t, a, b):
    """Whether node a is evicted before node b: older stamp, or the same access and a deeper last block."""
    sa, sb = t[a + N_STAMP], t[b + N_STAMP]
    return sa < sb or (sa == sb and t[a + N_DEPTH] + t[a + N_LENGTH] > t[b + N_DEPTH] + t[b + N_LENGTH])


@njit(cache=True)
def _unlink_nb(t, q, node):
    at = _node_at_nb(t, node)
    prev, nxt = t[at + N_PREV], t[at + N_NEXT]
    if prev >= 0:
        t[_node_at_nb(t, prev) + N_NEXT] = nxt
    else:
        t[q + Q_HEAD] = nxt
    if nxt >= 0:
        t[_node_at_nb(t, nxt) + N_PREV] = prev
    else:
        t[q + Q_TAIL] = prev


@njit(cache=True)
def _link_after_nb(t, q, node, after):
    """Put ``node`` after ``after`` in the queue (-1: at its head)."""
    at = _node_at_nb(t, node)
    nxt = t[q + Q_HEAD] if after < 0 else t[_node_at_nb(t, after) + N_NEXT]
    t[at + N_PREV] = after
    t[at + N_NEXT] = nxt
    if nxt >= 0:
        t[_node_at_nb(t, nxt) + N_PREV] = node
    else:
        t[q + Q_TAIL] = node
    if after >= 0:
        t[_node_at_nb(t, after) + N_NEXT] = node
    else:
        t[q + Q_HEAD] = node


@njit(cache=True)
def _link_in_order_nb(t, q, node):
    """Queue an unlocked node at the place of its key (from the tail: usually the newest)."""
    at = _node_at_nb(t, node)
    after = t[q + Q_TAIL]
    while after >= 0 and _before_nb(t, at, _node_at_nb(t, after)):
        after = t[_node_at_nb(t, after) + N_PREV]
    _link_after_nb(t, q, node, after)


@njit(cache=True)
def _new_node_nb(t, parent, depth, length, src, key):
    top = t[T_FREE_TOP]
    if top > 0:
        top -= 1
        t[T_FREE_TOP] = top
        node = t[t[T_FREE] + top]
    else:
        node = t[T_UNUSED]
        t[T_UNUSED] = node + 1
    at = _node_at_nb(t, node)
    t[at + N_PARENT] = parent
    t[at + N_DEPTH] = depth
    t[at + N_LENGTH] = length
    t[at + N_SRC] = src
    t[at + N_REF] = 0
    t[at + N_STAMP] = 0
    t[at + N_PREV] = -1
    t[at + N_NEXT] = -1
    t[at + N_KEY] = key
    t[at + N_OWNER] = -1
    t[at + N_BIRTH] = t[T_CLOCK]
    t[at + N_WEIGHT] = 0
    _map_insert_nb(t, key, node)
    return node


@njit(cache=True)
def _split_nb(t, q, ident, num_ranks, g, node, length):
    """Cut ``node`` after its first ``length`` blocks; the new node is that
    prefix (SGLang's ``_split_node``), ``node`` keeps the rest and its children.

    Returns the prefix node.
    """
    at = _node_at_nb(t, node)
    key = t[at + N_KEY]
    _map_delete_nb(t, key)
    head = _new_node_nb(t, t[at + N_PARENT], t[at + N_DEPTH], length, t[at + N_SRC], key)
    h = _node_at_nb(t, head)
    t[h + N_REF] = t[at + N_REF]
    t[h + N_STAMP] = t[at + N_STAMP]
    t[h + N_OWNER] = t[at + N_OWNER]
    t[h + N_BIRTH] = t[at + N_BIRTH]  # SGLang's split node takes the old child's place in the dict
    t[at + N_PARENT] = head
    t[at + N_DEPTH] += length
    t[at + N_LENGTH] -= length
    t[at + N_SRC] += length
    t[at + N_KEY] = ident_at_nb(ident, t[at + N_OWNER], t[at + N_SRC]) * num_ranks + g
    _map_insert_nb(t, t[at + N_KEY], node)
    if t[at + N_REF] == 0:  # one access's blocks, deeper ones first
        _link_after_nb(t, q, head, node)
    return head


@njit(cache=True)
def _follow_nb(t, q, ident, num_ranks, g, first, depth, limit, k):
    """The node holding the block at ``depth`` of request k's path (its blocks
    from ``first`` in the flat order), cut so that it ends where that path stops matching it
    (at ``limit`` at the latest); -1 if that block is not resident.

    Returns ``(node, matched blocks)``.
    """
    here = first + depth
    node = _map_find_nb(t, ident_at_nb(ident, k, here) * num_ranks + g)
    if node < 0:
        return -1, 0
    at = _node_at_nb(t, node)
    length = t[at + N_LENGTH]
    # The first identity is the key.
    matched = same_run_nb(ident, t[at + N_OWNER], t[at + N_SRC], k, here, min(length, limit - depth))
    if matched < length:
        node = _split_nb(t, q, ident, num_ranks, g, node, matched)
    return node, matched


@njit(cache=True)
def _touch_nb(t, q, last):
    """A new access stamp for the path ending at ``last``; its unlocked nodes go to the queue's tail, deepest first."""
    stamp = t[T_CLOCK] + 1
    t[T_CLOCK] = stamp
    node = last
    while node >= 0:
        at = _node_at_nb(t, node)
        t[at + N_STAMP] = stamp
        if t[at + N_REF] == 0:
            _unlink_nb(t, q, node)
            _link_after_nb(t, q, node, t[q + Q_TAIL])
        node = t[at + N_PARENT]


@njit(cache=True)
def tree_match_nb(pc, g, num_ranks, k, known, block_size, blocks_used):
    """:func:`simcore.scheduler.radix_nb.radix_match_nb` on the tree.

    Parameters
    ----------
    pc, g, num_ranks, k, known, block_size, blocks_used
        As :func:`simcore.scheduler.radix_nb.radix_match_nb`.

    Returns
    -------
    hits, cached : int
        As :func:`simcore.scheduler.radix_nb.radix_match_nb`.
    """
    s = pc[0]
    ident = pc[1]
    t = tree_nb(s)
    q = t[T_QUEUES] + QUEUE_WIDTH * g
    _evict_nb(t, q, blocks_used, g)
    first = s[s[HDR_OFFSET] + k]
    limit = min(s[s[HDR_OFFSET] + k + 1] - first, (known - 1) // block_size)
    hits = 0
    last = -1
    while hits < limit:
        node, matched = _follow_nb(t, q, ident, num_ranks, g, first, hits, limit, k)
        if node < 0:
            break
        last = node
        hits += matched  # where the path left a node, the next lookup misses
    cached = 0
    node = last
    while node >= 0:
        at = _node_at_nb(t, node)
        if t[at + N_REF] == 0:
            cached += t[at + N_LENGTH]
        node = t[at + N_PARENT]
    _touch_nb(t, q, last)
    t[t[T_LAST] + k] = last
    return hits, cached


@njit(cache=True)
def tree_lock_nb(pc, g, k, hits, blocks_used):
    """Request k locks the path its last match found (``hits`` blocks): SGLang's
    ``inc_lock_ref`` (right after the match: nothing to evict).

    Parameters
    ----------
    pc, g, k, hits, blocks_used
        As :func:`simcore.scheduler.radix_nb.radix_lock_nb`.
    """
    s = pc[0]
    t = tree_nb(s)
    q = t[T_QUEUES] + QUEUE_WIDTH * g
    node = t[t[T_LAST] + k]
    while node >= 0:
        at = _node_at_nb(t, node)
        if t[at + N_REF] == 0:
            _unlink_nb(t, q, node)
            t[q + Q_CACHED] -= t[at + N_LENGTH]
            blocks_used[g] += t[at + N_LENGTH]
        t[at + N_REF] += 1
        node = t[at + N_PARENT]
    s[s[HDR_SETTLED] + k] = hits


@njit(cache=True)
def tree_insert_nb(pc, g, num_ranks, k, tokens, block_size, blocks_used):
    """:func:`simcore.scheduler.radix_nb.radix_insert_nb` on the tree.

    Parameters
    ----------
    pc, g, num_ranks, k, tokens, block_size, blocks_used
        As :func:`simcore.scheduler.radix_nb.radix_insert_nb`.
    """
    s = pc[0]
    ident = pc[1]
    t = tree_nb(s)
    q = t[T_QUEUES] + QUEUE_WIDTH * g
    _evict_nb(t, q, blocks_used, g)
    settled = s[HDR_SETTLED] + k
    first = s[s[HDR_OFFSET] + k]
    complete = min(tokens // block_size, s[s[HDR_OFFSET] + k + 1] - first)
    depth = s[settled]
    last = t[t[T_LAST] + k] if depth > 0 else -1
    while depth < complete:
        node, matched = _follow_nb(t, q, ident, num_ranks, g, first, depth, complete, k)
        if node < 0:  # the rest is new: the request's own blocks become one node
            key = ident_at_nb(ident, k, first + depth) * num_ranks + g
            last = _new_node_nb(t, last, depth, complete - depth, first + depth, key)
            t[_node_at_nb(t, last) + N_REF] = 1
            t[_node_at_nb(t, last) + N_OWNER] = k
            depth = complete
            break
        # Resident already: the request's copies are freed, it locks the tree's.
        at = _node_at_nb(t, node)
        blocks_used[g] -= matched
        if t[at + N_REF] == 0:
            _unlink_nb(t, q, node)
            t[q + Q_CACHED] -= matched
            blocks_used[g] += matched
        t[at + N_REF] += 1
        last = node
        depth += matched
    if depth > s[settled]:
        s[settled] = depth
        t[t[T_LAST] + k] = last
    _touch_nb(t, q, last)


@njit(cache=True)
def tree_release_nb(pc, g, k, held, blocks_used):
    """:func:`simcore.scheduler.radix_nb.radix_release_nb` on the tree.

    Parameters
    ----------
    pc, g, k, held, blocks_used
        As :func:`simcore.scheduler.radix_nb.radix_release_nb`.
    """
    s = pc[0]
    t = tree_nb(s)
    q = t[T_QUEUES] + QUEUE_WIDTH * g
    _evict_nb(t, q, blocks_used, g)
    settled = s[HDR_SETTLED] + k
    private = held[k]
    if s[settled] > 0:
        node = t[t[T_LAST] + k]
        while node >= 0:
            at = _node_at_nb(t, node)
            private -= t[at + N_LENGTH]
            t[at + N_REF] -= 1
            if t[at + N_REF] == 0:
                blocks_used[g] -= t[at + N_LENGTH]
                t[q + Q_CACHED] += t[at + N_LENGTH]
                _link_in_order_nb(t, q, node)
            node = t[at + N_PARENT]
        s[settled] = 0
    t[t[T_LAST] + k] = -1
    blocks_used[g] -= private
    held[k] = 0


@njit(cache=True)
def _evict_nb(t, q, blocks_used, g, marked=-1):
    """Evict the blocks allocated beyond the free ones since the last tree
    operation, from the queue's head, the deepest block of a node first.

    ``marked``: the offset of a count of the blocks of nodes whose ``N_STAMP``
    is a mark, not an access stamp, kept here (``kv_tree_nb``); -1: none.
    """
    shortfall = blocks_used[g] + t[q + Q_CACHED] - t[q + Q_BLOCKS]
    while shortfall > 0:
        node = t[q + Q_HEAD]
        at = _node_at_nb(t, node)
        take = min(t[at + N_LENGTH], shortfall)
        t[at + N_LENGTH] -= take
        t[q + Q_CACHED] -= take
        if marked >= 0 and t[at + N_STAMP] != 0:
            t[marked] -= take
        shortfall -= take
        if t[at + N_LENGTH] == 0:
            _unlink_nb(t, q, node)
            _map_delete_nb(t, t[at + N_KEY])
            top = t[T_FREE_TOP]
            t[t[T_FREE] + top] = node
            t[T_FREE_TOP] = top + 1
