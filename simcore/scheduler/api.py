"""The scheduler stage's kernel inputs: the per-rank limits and policy (``Ranks``) and the prefix cache's shape.

Everything that depends on the scheduling policy reads its registry entry
(:mod:`simcore.scheduler.policies`), so ``simcore.engine.api.prepare`` only
assembles what this module gives.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np

from simcore.engine.state import Ranks
from simcore.scheduler.kv_tree import kv_tree_applies
from simcore.scheduler.offload import OffloadShape, offload_shape
from simcore.scheduler.policies import BUILDER_SGLANG, CACHE_AWARE_ORDERS
from simcore.scheduler.policies import policy as policy_spec
from simcore.scheduler.prefix import prompt_block_identities, radix_block_identities, radix_tree_identities
from simcore.scheduler.radix import tree_shaped
from simcore.scheduler.settings import PoolConfig
from simcore.errors import ConfigError
from simcore.scheduler.speculative import MAX_DRAFT_TOKENS, geometric_alpha
from simcore.workload.table import RequestTable

# SGLang 0.5 defaults (Scheduler.__init__): new_token_ratio starts at 0.7 x
# schedule_conservativeness (at most 1), floors at 0.14 of that and decays to
# the floor over 600 decode steps.
SGLANG_INIT_RATIO = 0.7
SGLANG_MIN_RATIO_FACTOR = 0.14
SGLANG_RATIO_DECAY_STEPS = 600


class PrefixCacheInputs(NamedTuple):
    """What the prefix-cache state of one configuration is built from (fields of ``engine.api.Prepared``)."""

    cache_shape: tuple  # num_slots, num_ranks, ident_offset, ident
    offload_shape: OffloadShape | None  # the CPU tier (simcore.scheduler.offload)
    radix_tree: bool  # SGLang's radix cache as a node tree (simcore.scheduler.radix)
    kv_tree: bool  # vLLM's prefix cache as a node tree (simcore.scheduler.kv_tree)


#: The acceptance draws' spawn key under the run seed (the routers' are 1 and 2).
SPEC_STREAM = 3


#: The waiting-queue shuffles' spawn key under the run seed (SGLang ``random``; 4 is the priority classes').
SHUFFLE_STREAM = 5


def stream_key(seed: int, stream: int) -> int:
    """63 bits of the run seed's stream ``stream``: the key of a counter-based draw in the kernel
    (``SPEC_STREAM``: the acceptance draws of ``simcore.scheduler.spec_nb``; ``SHUFFLE_STREAM``:
    SGLang ``random``'s shuffles in ``simcore.scheduler.nb``).

    Parameters
    ----------
    seed : int
        The run seed.
    stream : int
        The spawn key under the seed.

    Returns
    -------
    int
    """
    state = np.random.SeedSequence(seed, spawn_key=(stream,)).generate_state(1, dtype=np.uint64)
    return int(state[0]) & (2**63 - 1)


def request_acceptance(pools: Sequence[PoolConfig], acceptance_length: np.ndarray | None) -> np.ndarray:
    """Each request's own per-proposal acceptance ``alpha`` (``Requests.spec_alpha``), from its mean
    acceptance length (the request table's ``acceptance_length``; the geometric model, docs/speculative.md).

    Parameters
    ----------
    pools : sequence of PoolConfig
        The active pools; the last one emits the tokens.
    acceptance_length : ndarray(float64, ndim=1) or None
        Per request, tokens per verification (NaN: the pool's rates).

    Returns
    -------
    ndarray(float64, ndim=1)
        Per request (NaN: the pool's rates); empty without the column.

    Raises
    ------
    ConfigError
        The column without speculative decoding, or a value above 1 + the pool's positions.
    """
    if acceptance_length is None:
        return np.zeros(0, dtype=np.float64)
    emitting = pools[-1]
    name = "aggregated" if len(pools) == 1 else "decode"
    if emitting.speculative is None:
        raise ConfigError(f"the request table's acceptance_length column needs engine.{name}.speculative.config")
    positions = emitting.speculative.positions
    above = acceptance_length > positions + 1
    if above.any():
        i = int(np.argmax(above))
        raise ConfigError(f"acceptance_length must be at most 1 + {positions} (engine.{name}.speculative: "
                          f"{positions} positions) at row {i}, got {float(acceptance_length[i])!r}")
    return np.ascontiguousarray(geometric_alpha(acceptance_length, positions), dtype=np.float64)


def request_streams(pools: Sequence[PoolConfig], prompt_id: np.ndarray | None, n: int) -> np.ndarray:
    """Each request's speculative draw stream (``Requests.spec_stream``): with the token-emitting
    pool's ``speculative.draws=prompt``, its prompt id (the request table's ``prompt_id``; without
    the column, its row); else empty (each request its own stream, docs/speculative.md).

    Parameters
    ----------
    pools : sequence of PoolConfig
        The active pools; the last one emits the tokens.
    prompt_id : ndarray(int64, ndim=1) or None
        Per request, its prompt id (>= 0).
    n : int
        Requests.

    Returns
    -------
    ndarray(int64, ndim=1)
        (n,) with ``draws=prompt``, else (0,).
    """
    spec = pools[-1].speculative
    if spec is None or spec.draws != "prompt":
        return np.zeros(0, dtype=np.int64)
    if prompt_id is None:
        return np.arange(n, dtype=np.int64)
    return np.ascontiguousarray(prompt_id, dtype=np.int64)


def rank_inputs(pools: Sequence[PoolConfig], policy: str, seed: int = 0) -> Ranks:
    """Per global rank (the pools' ranks in worker order): the scheduler limits and the policy's kernel code.

    Parameters
    ----------
    pools : sequence of PoolConfig
        The active pools in worker-index order (aggregated; or prefill, then decode).
    policy : str
        ``engine.policy``.
    seed : int
        The run seed (the key of the speculative acceptance draws).

    Returns
    -------
    Ranks
        ``chunk_tokens`` and ``ratio_params`` are 0 unless the policy runs
        SGLang's builder (its chunk budget is split over the attention-DP ranks);
        ``chunked_prefill`` is false only where the pool turned vLLM's chunked
        prefill off.
    """
    spec = policy_spec(policy)
    ranks = [pool for pool in pools for _ in range(pool.num_ranks)]

    def per_rank(field):
        return np.array([getattr(pool, field) or 0 for pool in ranks], dtype=np.int64)

    ratio = np.zeros((len(ranks), 3), dtype=np.float64)
    chunk = np.zeros(len(ranks), dtype=np.int64)
    if spec.builder == BUILDER_SGLANG:
        for g, pool in enumerate(ranks):
            init = min(SGLANG_INIT_RATIO * pool.schedule_conservativeness, 1.0)
            floor = min(init * SGLANG_MIN_RATIO_FACTOR, 1.0)
            ratio[g] = (init, floor, (init - floor) / SGLANG_RATIO_DECAY_STEPS)
            chunk[g] = max(pool.chunked_prefill_size // pool.attention_dp, 1)
    # Prefix caching runs on the receiving pool (aggregated, or P/D prefill).
    prefix_caching = np.zeros(len(ranks), dtype=np.bool_)
    prefix_caching[: pools[0].num_ranks] = pools[0].prefix_caching
    rates = np.zeros((len(ranks), MAX_DRAFT_TOKENS), dtype=np.float64)
    proposer = np.zeros((len(ranks), 4), dtype=np.float64)
    proposer[:, 3] = 1.0
    for g, pool in enumerate(ranks):
        speculation = pool.speculative
        if speculation is not None:
            rates[g, : speculation.positions] = speculation.rates
            proposer[g] = (speculation.proposer_steps, speculation.proposer_step_ms, speculation.proposer_per_seq_us,
                           speculation.proposal_rate)
    return Ranks(
        max_batched_tokens=per_rank("max_batched_tokens"),
        max_sequences=per_rank("max_sequences"),
        num_blocks=per_rank("num_blocks"),
        block_size=per_rank("block_size"),
        seq_limit=per_rank("sequence_limit"),
        policy=np.full(len(ranks), spec.code, dtype=np.int64),
        chunk_tokens=chunk,
        max_prefill_tokens=per_rank("max_prefill_tokens"),
        ratio_params=ratio,
        prefix_caching=prefix_caching,
        reserve_full_isl=np.array([pool.reserve_full_isl for pool in ranks], dtype=np.bool_),
        cache_generated_blocks=np.array([pool.cache_generated_blocks for pool in ranks], dtype=np.bool_),
        # a policy that does not use the key (None) chunks in its own way
        chunked_prefill=np.array([pool.chunked_prefill is not False for pool in ranks], dtype=np.bool_),
        spec_drafts=np.array([0 if p.speculative is None else p.speculative.draft_tokens for p in ranks], dtype=np.int64),
        spec_lookahead=np.array([0 if p.speculative is None else p.speculative.lookahead for p in ranks], dtype=np.int64),
        spec_rates=rates,
        spec_proposer=proposer,
        spec_key=np.full(len(ranks), stream_key(seed, SPEC_STREAM), dtype=np.int64),
        spec_positions=np.array([0 if p.speculative is None else p.speculative.positions for p in ranks],
                                dtype=np.int64),
        queue_order=np.array([spec.order_code(pool.queue_order) for pool in ranks], dtype=np.int64),
        preempt_lowest=np.array([pool.queue_order == "priority" for pool in ranks], dtype=np.bool_),
        shuffle_key=np.full(len(ranks), stream_key(seed, SHUFFLE_STREAM), dtype=np.int64),
    )


def queue_keys(pools: Sequence[PoolConfig], requests: RequestTable) -> np.ndarray:
    """Each request's waiting-queue key (``Requests.queue_key``; lower first) under the pools' queue orders.

    ``priority``: the table's priority (0 without the column); ``lof``: minus the
    requested output tokens; ``shortest_prompt``: the prompt tokens;
    ``shortest_output``: the table's ``predicted_output_tokens``.  All pools of a
    deployment with a keyed order share one key, so keyed orders may not differ
    between pools.

    Parameters
    ----------
    pools : sequence of PoolConfig
        The active pools.
    requests : RequestTable

    Returns
    -------
    ndarray(int64, ndim=1)
        Per request (zeros when every pool is FCFS).

    Raises
    ------
    ConfigError
        Two pools with different keyed orders, or ``shortest_output`` without the column.
    """
    n = len(requests)
    orders = {pool.queue_order for pool in pools} - {"fcfs", "random", *CACHE_AWARE_ORDERS}
    if not orders:
        return np.zeros(n, dtype=np.int64)
    if len(orders) > 1:
        raise ConfigError(f"engine.prefill.queue_order and engine.decode.queue_order must be equal or fcfs, "
                          f"got {' and '.join(sorted(orders))}")
    order = orders.pop()
    if order == "priority":
        key = np.zeros(n, dtype=np.int64) if requests.priority is None else requests.priority
    elif order == "lof":
        key = -requests.output_tokens
    elif order == "shortest_prompt":
        key = requests.input_tokens
    else:
        if requests.predicted_output_tokens is None:
            raise ConfigError("queue_order=shortest_output needs the request table's predicted_output_tokens column")
        key = requests.predicted_output_tokens
    return np.ascontiguousarray(key, dtype=np.int64)


def prefix_cache_inputs(
    receiving: PoolConfig, policy: str, requests: RequestTable, workload, router_policy: str, num_ranks: int,
    path: str = "engine.aggregated",
) -> PrefixCacheInputs:
    """The prefix cache's block identities, its CPU tier and which representation runs it.

    Parameters
    ----------
    receiving : PoolConfig
        The pool that caches prefixes (aggregated, or P/D prefill).
    policy : str
        ``engine.policy``: its registry entry's ``prefix_cache`` (``radix``
        caches generated tokens too, ``blocks`` may run on the node tree).
    requests : RequestTable
    workload : WorkloadConfig
        Its ``block_size`` and ``prefix_tokens`` (the table's hash blocks).
    router_policy : str
        ``engine.router.policy`` (a node tree needs round-robin-like placement).
    num_ranks : int
        Global ranks of the deployment.
    path : str
        The receiving pool's dotted path, for messages.

    Returns
    -------
    PrefixCacheInputs

    Raises
    ------
    ConfigError
        ``queue_order=dfs-weight`` where the radix cache would run a node per block.
    """
    n = len(requests)
    radix = policy_spec(policy).prefix_cache == "radix"
    radix_tree = bool(receiving.prefix_caching and radix and tree_shaped(requests, router_policy))
    if receiving.queue_order == "dfs-weight" and receiving.prefix_caching and not radix_tree:
        # the walk orders a node's children by the time they joined it, which the node tree keeps
        raise ConfigError(f"{path}.queue_order=dfs-weight needs a radix cache that runs as a node tree: "
                          f"prefix-chained hash_ids (or none) and engine.router.policy other than prefix_aware")
    if receiving.prefix_caching:
        generated_too = radix or receiving.cache_generated_blocks
        identities = radix_block_identities if generated_too else prompt_block_identities
        identities = radix_tree_identities if radix_tree else identities
        ident_offset, ident = identities(requests, receiving.block_size, workload.block_size, workload.prefix_tokens)
        num_slots = receiving.num_blocks * receiving.num_ranks
    else:
        ident_offset, ident, num_slots = np.zeros(n + 1, dtype=np.int64), np.zeros(0, dtype=np.int64), 1
    return PrefixCacheInputs(
        cache_shape=(num_slots, num_ranks, ident_offset, ident),
        offload_shape=offload_shape(receiving, num_ranks, n),
        radix_tree=radix_tree,
        kv_tree=bool(receiving.prefix_caching and kv_tree_applies(receiving, policy)
                     and tree_shaped(requests, router_policy)),
    )
