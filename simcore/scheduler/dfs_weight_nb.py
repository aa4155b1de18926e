"""SGLang's ``dfs-weight`` waiting-queue order on the radix cache's node tree (docs/semantics.md, "Queue orders").

Contract: ``@njit(cache=True)`` functions over the engine kernel's waiting queues
(doubly linked lists through per-request links, ``simcore.scheduler.nb``) and the
prefix-cache state holding the node tree of ``simcore.scheduler.radix_tree_nb``
(the settings refuse the order where the cache would run a node per block).

SGLang (``python/sglang/srt/managers/schedule_policy.py`` at commit 00550cd1:
``calc_priority`` lines 261-330, its ``_compute_prefix_matches`` 374-431 calling
``match_prefix_for_req`` 158-218, ``_sort_by_dfs_weight`` 533-538; the walk is
``_dfs_weight_order`` in ``python/sglang/srt/mem_cache/base_prefix_cache.py`` at
commit 00ac7105, lines 260-300) matches every waiting request in the radix
cache, in list order, which leaves each request's ``last_node``.  A node weighs
the waiting requests whose last node is in its subtree.  The list becomes the
order of a depth-first walk from the root that visits a node's children by
decreasing weight (a stable sort of the ``children`` dict, so equal weights
keep the order the dict received them) and puts a node's own requests, in list
order, after its children's subtrees.
No queue length turns it off (``_determine_active_policy``, lines 332-343, falls
back to FCFS above 128 waiting for ``lpm`` and ``hrrn`` only).

Here the walk is a stable sort of the waiting requests by a comparison of
their root-to-last-node paths: where two paths part, the child of greater
weight, then the older (``N_BIRTH``), goes first; a path that is a prefix of
the other goes after it (the node's own requests after its subtree); equal
paths keep queue order.  Children no waiting request passes have weight 0:
they come after the others and hold no request, so they are not visited.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from simcore.scheduler.kv_nb import HDR_GENERATION
from simcore.scheduler.radix_tree_nb import N_BIRTH, N_PARENT, N_WEIGHT, T_LAST, tree_match_nb, tree_nb, _node_at_nb


@njit(cache=True)
def _dfs_before_nb(t, path, start, i, j):
    """Whether the request at queue position i goes strictly before the one at j in the walk."""
    a, a_end = start[i], start[i + 1]
    b, b_end = start[j], start[j + 1]
    if a_end - a == b_end - b and (a == a_end or path[a_end - 1] == path[b_end - 1]):
        return False  # the same last node: list order
    while a < a_end and b < b_end and path[a] == path[b]:
        a += 1
        b += 1
    if a == a_end:  # i's last node is j's or an ancestor of it: j's subtree first, or list order
        return False
    if b == b_end:  # j's last node is an ancestor of i's
        return True
    x = _node_at_nb(t, path[a])
    y = _node_at_nb(t, path[b])
    if t[x + N_WEIGHT] != t[y + N_WEIGHT]:
        return t[x + N_WEIGHT] > t[y + N_WEIGHT]
    return t[x + N_BIRTH] < t[y + N_BIRTH]


@njit(cache=True)
def sort_dfs_weight_nb(pc, g, num_ranks, block_size, blocks_used, input_tokens, generated, head, tail, nxt, prv):
    """SGLang ``dfs-weight``: reorder rank g's waiting queue by the depth-first walk of the radix tree.

    Every waiting request is matched, in queue order, on its whole blocks of
    prompt and generated tokens (SGLang matches ``origin_input_ids +
    output_ids``; the cap at ``known - 1`` tokens applies to its hit count, not
    to ``last_node``), which refreshes the path's access stamps as
    ``match_prefix`` does.

    Parameters
    ----------
    pc : tuple of ndarray(int64, ndim=1)
        The prefix cache ``(state, ident)`` holding the node tree; mutated (matches, scratch weights).
    g : int
        Global rank.
    num_ranks : int
        Global ranks.
    block_size : int
        Tokens per block.
    blocks_used : ndarray(int64, ndim=1)
        In-use blocks per rank.
    input_tokens, generated : ndarray(int64, ndim=1)
        Per request, prompt tokens and tokens generated so far.
    head, tail : ndarray(int64, ndim=1)
        Per rank, first and last waiting request; updated.
    nxt, prv : ndarray(int64, ndim=1)
        Per request, waiting-queue links; updated.
    """
    s = pc[0]
    if s[HDR_GENERATION] >= 0:  # a node per block: not modelled (refused by the settings)
        return
    t = tree_nb(s)
    n = 0
    k = head[g]
    while k >= 0:
        n += 1
        k = nxt[k]
    buf = np.empty(n, dtype=np.int64)
    k = head[g]
    for i in range(n):
        buf[i] = k
        k = nxt[k]
    for i in range(n):
        k = buf[i]
        # known + 1: radix_match_nb's limit (known - 1) // bs becomes the whole blocks of known
        tree_match_nb(pc, g, num_ranks, k, input_tokens[k] + generated[k] + 1, block_size, blocks_used)
    # Each request's path, root side first, and the weights along it.
    start = np.zeros(n + 1, dtype=np.int64)
    for i in range(n):
        node = t[t[T_LAST] + buf[i]]
        length = 0
        while node >= 0:
            at = _node_at_nb(t, node)
            t[at + N_WEIGHT] += 1
            length += 1
            node = t[at + N_PARENT]
        start[i + 1] = start[i] + length
    path = np.empty(start[n], dtype=np.int64)
    for i in range(n):
        node = t[t[T_LAST] + buf[i]]
        p = start[i + 1] - 1
        while node >= 0:
            path[p] = node
            p -= 1
            node = t[_node_at_nb(t, node) + N_PARENT]
    # Stable bottom-up merge sort of the queue positions.
    order = np.arange(n)
    spare = np.empty(n, dtype=np.int64)
    width = 1
    while width < n:
        lo = 0
        while lo < n:
            mid = min(lo + width, n)
            hi = min(lo + 2 * width, n)
            a, b, o = lo, mid, lo
            if mid < hi and not _dfs_before_nb(t, path, start, order[mid], order[mid - 1]):
                # already in order (the queue as the last sort left it, arrivals at its back)
                while o < hi:
                    spare[o] = order[o]
                    o += 1
                a, b = mid, hi
            while a < mid and b < hi:
                if _dfs_before_nb(t, path, start, order[b], order[a]):
                    spare[o] = order[b]
                    b += 1
                else:
                    spare[o] = order[a]
                    a += 1
                o += 1
            while a < mid:
                spare[o] = order[a]
                a += 1
                o += 1
            while b < hi:
                spare[o] = order[b]
                b += 1
                o += 1
            lo = hi
        order, spare = spare, order
        width *= 2
    for p in range(start[n]):
        t[_node_at_nb(t, path[p]) + N_WEIGHT] = 0
    if n == 0:
        return
    head[g] = buf[order[0]]
    tail[g] = buf[order[n - 1]]
    for i in range(n):
        k = buf[order[i]]
        prv[k] = buf[order[i - 1]] if i > 0 else -1
        nxt[k] = buf[order[i + 1]] if i + 1 < n else -1
