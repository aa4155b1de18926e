"""vLLM's prefix cache as a node tree, Python side (``simcore.scheduler.kv_tree_nb``).

The tree gives ``kv_nb``'s block model's results when the identities are
tree-shaped (:func:`simcore.scheduler.radix.tree_shaped`) and nothing else
reads the block model: :func:`kv_tree_applies` decides, :func:`kv_tree_prefix_cache`
builds the state.
"""

from __future__ import annotations

import numpy as np

from simcore.scheduler.kv_nb import HDR_BLOCK_SLOT
from simcore.scheduler.policies import policy as policy_spec
from simcore.scheduler.kv_tree_nb import P_COUNTS, P_RANKS, P_RUNS, V_MEMO_REQUEST, V_WIDTH
from simcore.scheduler.radix import radix_prefix_cache
from simcore.scheduler.radix_tree_nb import T_FREE


def kv_tree_applies(pool, policy: str) -> bool:
    """Whether the receiving pool's prefix cache may run on the tree (with tree-shaped identities).

    The policies whose prefix cache is hashed prompt blocks (the registry's
    ``prefix_cache="blocks"``: vLLM's, and TensorRT-LLM's reuse, which makes the
    same calls at other moments: ``simcore.scheduler.nb._reusable_nb``), without
    the CPU tier (``kv_offload``) or the caching of generated blocks, which
    read or extend the block model's slots.

    Parameters
    ----------
    pool : PoolConfig
        The receiving pool (aggregated, or P/D prefill).
    policy : str
        ``engine.policy``.

    Returns
    -------
    bool
    """
    return policy_spec(policy).prefix_cache == "blocks" and pool.kv_offload is None and not pool.cache_generated_blocks


def kv_tree_prefix_cache(num_slots: int, num_ranks: int, ident_offset: np.ndarray, ident: np.ndarray,
                         offload_tail: np.ndarray, num_blocks: np.ndarray) -> tuple:
    """The prefix-cache state with an empty tree and no runs.

    Parameters
    ----------
    num_slots, num_ranks, ident_offset, ident, offload_tail, num_blocks
        As :func:`simcore.scheduler.radix.radix_prefix_cache`.

    Returns
    -------
    tuple of ndarray(int64, ndim=1)
        ``(state, ident)``.
    """
    n = ident_offset.shape[0] - 1
    # The header, a record per rank, per request its runs' count, then their lists.
    sizes = [P_RANKS, V_WIDTH * num_ranks, n, int(ident.shape[0]) + n]
    part_bases = np.concatenate([[0], np.cumsum(sizes)])
    state, ident = radix_prefix_cache(num_slots, num_ranks, ident_offset, ident, offload_tail, num_blocks,
                                      extra=int(part_bases[-1]))
    tree = state[state[HDR_BLOCK_SLOT] :]
    part = int(tree[T_FREE]) + num_slots  # after the free stack (_runs_part_nb)
    tree[part + P_COUNTS] = part + int(part_bases[2])
    tree[part + P_RUNS] = part + int(part_bases[3])
    tree[part + P_RANKS : part + int(part_bases[3])] = 0
    ranks = tree[part + P_RANKS : part + int(part_bases[2])].reshape(num_ranks, V_WIDTH)
    ranks[:, V_MEMO_REQUEST] = -1
    return state, ident
