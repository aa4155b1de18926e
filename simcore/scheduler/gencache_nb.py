"""Generated-block caching of the vllm policy (``engine.<pool>.cache_generated_blocks``, docs/prefix-caching.md).

vLLM hashes every full block of a request's tokens, generated ones included,
and caches it once its tokens are computed (``KVCacheManager.allocate_slots``
and, under asynchronous scheduling, ``AsyncScheduler._update_request_with_output``).
With the key on, each request's identities (``simcore.scheduler.prefix.radix_block_identities``)
cover its generated blocks too.  A generated block is unique to its request
(with sessions, to the request and its session's later turns, which are sent
only after it finishes), so no one can hit it while the request holds it:
registering it when the request releases its blocks, just before the release,
leaves every result as registering it when it fills.  Prompt blocks keep
their registration at scheduling (``simcore.scheduler.nb``).
"""

from __future__ import annotations

from numba import njit

from simcore.scheduler.kv_tree_nb import prefix_register_nb


@njit(cache=True, inline="always")
def cache_generated_on_release_nb(pc, ranks, g, k, tokens, blocks_used):
    """Before request k releases its blocks on rank g: register its full blocks
    of ``tokens`` tokens, if rank g caches generated blocks.

    Parameters
    ----------
    pc : tuple of ndarray(int64, ndim=1)
        The prefix-cache state (``simcore.scheduler.kv_nb``); updated.
    ranks : Ranks
        ``cache_generated_blocks``, ``block_size`` and the rank count.
    g : int
        Global rank.
    k : int
        Request index.
    tokens : int
        Tokens whose KV vLLM has cached: the computed ones, less those of an
        output still in flight (asynchronous scheduling: its token is not known
        when its block's hash would be taken), tokens.
    blocks_used : ndarray(int64, ndim=1)
        In-use blocks per rank (the registration's, whichever state holds the cache).
    """
    if ranks.cache_generated_blocks[g]:
        prefix_register_nb(pc, g, ranks.num_blocks.shape[0], k, tokens, ranks.block_size[g], blocks_used)
