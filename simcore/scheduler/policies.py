"""The scheduling policies (``engine.policy``): one declaration each (docs/policies.md).

A :class:`Policy` holds everything the simulator knows about a policy: its
name, the engine kernel's behaviour it runs (:data:`KERNEL_CODES`, written to
``Ranks.policy``), the batch builder that behaviour uses, the defaults of the
pool keys, its aiconfigurator backend, its prefix cache and the pool features
it supports.  Every reader (the settings checks, the timing settings,
``simcore.engine.api.prepare`` through the scheduler stage, the prefix-cache
tree eligibility, the reference implementation) asks :data:`SCHEDULING_POLICIES`,
never a policy name, so a variant (``vllm_no_chunk``) is one more entry here.

The numba kernels do not import this module (they compare the ``POLICY_*``
codes of ``simcore.scheduler.nb``, which :data:`KERNEL_CODES` must equal:
``tests/test_policies.py``); were they to, it must join
``simcore.jit_cache.kernel_modules``.  Imports nothing of the simulator.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from types import MappingProxyType
from typing import Any, Mapping

#: The engine kernel's scheduling behaviours by their ``Ranks.policy`` code
#: (``simcore.scheduler.nb.POLICY_*``): vLLM's batch builder; SGLang's, with its
#: radix cache and new-token ratio; vLLM's builder with TensorRT-LLM's
#: GUARANTEED_NO_EVICT admission and its block reuse at a request's end.
KERNEL_CODES = MappingProxyType({"vllm": 0, "sglang": 1, "trtllm": 2})
#: The batch builders of ``simcore.scheduler.nb`` (``build_vllm_batch_nb``,
#: ``build_sglang_batch_nb``), and the one each behaviour runs.
BUILDER_VLLM, BUILDER_SGLANG = "vllm", "sglang"
KERNEL_BUILDERS = MappingProxyType({"vllm": BUILDER_VLLM, "sglang": BUILDER_SGLANG, "trtllm": BUILDER_VLLM})
#: The prefix caches: hashed prompt blocks (vLLM's, TensorRT-LLM's reuse; the node
#: tree of ``simcore.scheduler.kv_tree`` may run it) and SGLang's radix cache
#: (prompt and generated tokens, ``simcore.scheduler.radix``).
PREFIX_CACHES = ("blocks", "radix")
#: The pool keys whose defaults depend on the policy, in the order they are resolved.
POOL_KEYS = ("max_batched_tokens", "max_sequences", "block_size", "chunked_prefill_size",
             "max_prefill_tokens", "schedule_conservativeness", "chunked_prefill")
#: ``engine.policy``'s default, and the defaults read for a policy not (yet) checked.
DEFAULT_POLICY = "vllm"
#: ``engine.<pool>.queue_order``: the waiting-queue orders (docs/semantics.md, "Queue orders").
#: ``fcfs`` is every engine's default; ``priority`` is vLLM's ``--scheduling-policy priority``;
#: ``lof``, ``random``, ``lpm`` and ``dfs-weight`` are SGLang's ``--schedule-policy`` of those names;
#: ``shortest_prompt`` and ``shortest_output`` (by the table's ``predicted_output_tokens``) are
#: research orders, no engine's default.
QUEUE_ORDERS = ("fcfs", "priority", "lof", "random", "lpm", "dfs-weight", "shortest_prompt", "shortest_output")
#: The orders that read the prefix cache (SGLang's ``CacheAwarePolicy``): they need it on.
CACHE_AWARE_ORDERS = ("lpm", "dfs-weight")
#: ``Ranks.queue_order`` codes: the arrival order; a key, then the instant the request
#: entered the rank (vLLM's heap of requests); a key, then insertion order (SGLang's stable
#: sort of its waiting list); arrival order shuffled before each extend batch (SGLang's
#: ``random``); arrival order sorted by the prefix cache's match before each extend batch
#: (SGLang's ``lpm``); arrival order walked depth first in the radix tree before each extend
#: batch (SGLang's ``dfs-weight``).  ``simcore.scheduler.nb.ORDER_*`` must equal them.
ORDER_FCFS, ORDER_KEY_INSTANT, ORDER_KEY_STABLE, ORDER_RANDOM, ORDER_LPM, ORDER_DFS_WEIGHT = 0, 1, 2, 3, 4, 5


@dataclass(frozen=True)
class Policy:
    """One scheduling policy.

    The feature flags name the pool keys (and ``timing.cuda_graph_sizes=vllm_default``)
    the policy supports; the settings refuse them on the others.
    """

    name: str
    kernel: str  # a KERNEL_CODES key: the kernel behaviour it runs
    defaults: Mapping[str, Any]  # each of POOL_KEYS; None: the key is not used
    aic_backend: str  # aiconfigurator-core's backend for timing.type=aic (timing.backend: null)
    prefix_cache: str  # one of PREFIX_CACHES
    async_scheduling: bool = False  # pool.async_scheduling (docs/semantics.md)
    reserve_full_isl: bool = False  # pool.reserve_full_isl (docs/semantics.md)
    cache_generated_blocks: bool = False  # pool.cache_generated_blocks (docs/prefix-caching.md)
    kv_offload: bool = False  # pool.kv_offload, a CPU tier (docs/prefix-caching.md)
    # pool.chunked_prefill may be false (vLLM's --no-enable-chunked-prefill, docs/semantics.md)
    chunked_prefill: bool = False
    vllm_graph_sizes: bool = False  # timing.cuda_graph_sizes=vllm_default (vLLM's capture sizes)
    # pool.expert_parallel: the attention-DP ranks step together through the MoE layers (docs/semantics.md)
    expert_parallel: bool = False
    # the engine form of pool.speculative.config (simcore.scheduler.speculative.SPEC_FORMS)
    speculative_form: str = "vLLM --speculative-config"
    # the values of pool.queue_order it models (QUEUE_ORDERS), fcfs first
    queue_orders: tuple = ("fcfs",)

    def __post_init__(self):
        if self.kernel not in KERNEL_CODES or self.prefix_cache not in PREFIX_CACHES:
            raise ValueError(f"policy {self.name!r}: unknown kernel {self.kernel!r} or prefix cache {self.prefix_cache!r}")
        if tuple(self.defaults) != POOL_KEYS:
            raise ValueError(f"policy {self.name!r}: defaults must give {POOL_KEYS} in order")
        if self.defaults["chunked_prefill"] is False and not self.chunked_prefill:
            raise ValueError(f"policy {self.name!r}: a chunked_prefill default of False needs the chunked_prefill feature")
        if self.chunked_prefill and KERNEL_BUILDERS[self.kernel] != BUILDER_VLLM:
            raise ValueError(f"policy {self.name!r}: chunked_prefill=false is modelled in vLLM's batch builder only")
        if not self.queue_orders or self.queue_orders[0] != "fcfs" or not set(self.queue_orders) <= set(QUEUE_ORDERS):
            raise ValueError(f"policy {self.name!r}: queue_orders must start with fcfs and be among {QUEUE_ORDERS}")

    @property
    def code(self) -> int:
        """``Ranks.policy``: the kernel behaviour's code."""
        return KERNEL_CODES[self.kernel]

    @property
    def builder(self) -> str:
        """The batch builder the kernel runs (``vllm`` or ``sglang``)."""
        return KERNEL_BUILDERS[self.kernel]

    def order_code(self, queue_order: str) -> int:
        """``Ranks.queue_order`` for ``queue_order`` (one of :attr:`queue_orders`): FCFS, or a key
        then the entry instant (vLLM's builder) or the insertion order (SGLang's)."""
        if queue_order == "fcfs":
            return ORDER_FCFS
        if queue_order == "random":
            return ORDER_RANDOM
        if queue_order == "lpm":
            return ORDER_LPM
        if queue_order == "dfs-weight":
            return ORDER_DFS_WEIGHT
        return ORDER_KEY_INSTANT if self.builder == BUILDER_VLLM else ORDER_KEY_STABLE


#: The features a :class:`Policy` flags (its boolean fields).
FEATURES = tuple(f.name for f in fields(Policy) if f.type == "bool")


def _defaults(max_batched_tokens=None, max_sequences=None, block_size=None, chunked_prefill_size=None,
              max_prefill_tokens=None, schedule_conservativeness=None, chunked_prefill=None) -> Mapping[str, Any]:
    return MappingProxyType(dict(
        max_batched_tokens=max_batched_tokens, max_sequences=max_sequences, block_size=block_size,
        chunked_prefill_size=chunked_prefill_size, max_prefill_tokens=max_prefill_tokens,
        schedule_conservativeness=schedule_conservativeness, chunked_prefill=chunked_prefill,
    ))


#: The policies by name, in the order messages list them.  Pool defaults from
#: each engine's own: vLLM (V1 engine, 0.11: block_size 16, max_num_seqs 256,
#: max_num_batched_tokens 8192 for the API server); SGLang (0.5: page_size 1,
#: chunked_prefill_size 8192, max_prefill_tokens 16384,
#: schedule_conservativeness 1.0; max_running_requests is derived from memory
#: there, 4096 here); TensorRT-LLM (1.0: tokens_per_block 32, max_num_tokens
#: 8192, max_batch_size 2048).  ``chunked_prefill``: vLLM's
#: ``enable_chunked_prefill`` (true by default in V1; only the entries with the
#: ``chunked_prefill`` feature may turn it off); TensorRT-LLM's builder chunks
#: too; SGLang's own chunking is ``chunked_prefill_size``.
SCHEDULING_POLICIES: dict[str, Policy] = {policy.name: policy for policy in (
    Policy(
        "vllm", kernel="vllm", aic_backend="vllm", prefix_cache="blocks",
        defaults=_defaults(max_batched_tokens=8192, max_sequences=256, block_size=16, chunked_prefill=True),
        async_scheduling=True, reserve_full_isl=True, cache_generated_blocks=True, kv_offload=True,
        chunked_prefill=True, vllm_graph_sizes=True, expert_parallel=True,
        queue_orders=("fcfs", "priority", "shortest_prompt", "shortest_output"),
    ),
    Policy(
        "sglang", kernel="sglang", aic_backend="sglang", prefix_cache="radix",
        defaults=_defaults(max_sequences=4096, block_size=1, chunked_prefill_size=8192, max_prefill_tokens=16384,
                           schedule_conservativeness=1.0),
        speculative_form="SGLang --speculative-*",
        queue_orders=("fcfs", "lof", "random", "lpm", "dfs-weight", "shortest_prompt", "shortest_output"),
    ),
    Policy(
        "trtllm", kernel="trtllm", aic_backend="trtllm", prefix_cache="blocks",
        defaults=_defaults(max_batched_tokens=8192, max_sequences=2048, block_size=32, chunked_prefill=True),
        speculative_form="TensorRT-LLM speculative_config",
    ),
)}
#: The policy names: a live view, so that a policy registered later (a test's) is accepted.
POLICIES = SCHEDULING_POLICIES.keys()


def policy(name: str) -> Policy:
    """The policy ``name`` (already checked), or the default policy's for a name not checked yet.

    Parameters
    ----------
    name : str
        ``engine.policy``.

    Returns
    -------
    Policy
    """
    return SCHEDULING_POLICIES.get(name, SCHEDULING_POLICIES[DEFAULT_POLICY])


def supports(name: str, feature: str) -> bool:
    """Whether the policy ``name`` supports ``feature`` (one of :data:`FEATURES`).

    Parameters
    ----------
    name : str
        ``engine.policy``.
    feature : str

    Returns
    -------
    bool
    """
    return getattr(policy(name), feature)


def supporting(feature: str) -> str:
    """The policies that support ``feature``, for messages (``vllm``, ``vllm or vllm_no_chunk``).

    Parameters
    ----------
    feature : str
        One of :data:`FEATURES`.

    Returns
    -------
    str
    """
    return " or ".join(name for name, spec in SCHEDULING_POLICIES.items() if getattr(spec, feature))
