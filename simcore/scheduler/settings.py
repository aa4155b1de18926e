"""A pool's scheduler settings, and every default that depends on the scheduling policy.

:mod:`simcore.scheduler.policies` declares each policy's own values of the
pool keys and the pool features it supports, and :class:`PoolConfig` declares
each pool key once (:func:`simcore.checks.key`); the pool keys left null take
the policy's default.  :func:`parse_pool` checks
one pool.  ``num_blocks: auto`` is left as :data:`AUTO_BLOCKS` on an active
pool here and resolved by :func:`simcore.derive.derive` from the timing model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from simcore.checks import (
    choice,
    count,
    default_of,
    flag,
    is_int,
    key,
    number,
    optional_count,
    section,
    shown,
)
from simcore.enums import RANK_POLICIES
from simcore.errors import ConfigError
from simcore.scheduler.policies import CACHE_AWARE_ORDERS, QUEUE_ORDERS, SCHEDULING_POLICIES, supporting, supports
from simcore.scheduler.policies import policy as policy_spec
from simcore.scheduler.speculative import (
    FORM_VLLM, SPEC_DRAWS, VLLM_NGRAM, Speculation, acceptance_rates, read_engine_form,
)
from simcore.units import INT64_MAX, MAX_INSTANT_MS

#: KV capacity of a rank when num_blocks is null, tokens: an 8B dense model on
#: an 80 GB GPU at 0.9 memory utilisation, (80 x 0.9 - 16) GB / 128 KiB per token.
DEFAULT_KV_TOKENS = 416_000

#: Per-policy defaults of the pool keys (None: the key is not used), read off
#: the registry (:data:`simcore.scheduler.policies.SCHEDULING_POLICIES`).
POLICY_DEFAULTS = {name: dict(spec.defaults) for name, spec in SCHEDULING_POLICIES.items()}
#: The string ``engine.<pool>.num_blocks`` accepts with timing.type=aic or roofline.
AUTO_BLOCKS = "auto"
#: The pool budgets a pass's token count is bounded by (whichever the policy uses).
TOKEN_BUDGETS = ("max_batched_tokens", "chunked_prefill_size", "max_prefill_tokens")


@dataclass(frozen=True)
class KVOffloadConfig:
    """A rank's CPU tier of KV blocks (vLLM's OffloadingConnector, docs/prefix-caching.md)."""

    num_blocks: int = key(
        None,
        doc="vllm with prefix_caching: CPU KV blocks per rank (at the pool's block_size); all three null: no CPU tier.",
        unit="blocks",
        values="integer >= 1 or null",
    )
    bandwidth_gb_per_second: float = key(
        None,
        doc="CPU tier: transfer bandwidth in each direction.",
        values="number > 0 or null",
    )
    bytes_per_token: float = key(None, doc="CPU tier: KV bytes per token.", values="number > 0 or null")

    def block_ns(self, block_size: int) -> int:
        """One block's copy, ns: rint(block_size x bytes_per_token / (bandwidth x 1e9) x 1e9)."""
        return int(np.rint(block_size * self.bytes_per_token / (self.bandwidth_gb_per_second * 1e9) * 1e9))


@dataclass(frozen=True)
class SpeculativeConfig:
    """A pool's speculative decoding (docs/speculative.md); ``config`` null: off."""

    config: Any = key(
        None,
        doc="Aggregated or decode pool: speculative decoding in the policy's engine form, verbatim (vLLM's "
            "--speculative-config JSON, SGLang's --speculative-* arguments, TensorRT-LLM's speculative_config; "
            "docs/speculative.md); null: off.",
        values="mapping, JSON object string or null",
    )
    acceptance_rates: list | None = key(
        None,
        doc="With config: per draft position, the probability that it is accepted (vLLM's per-position "
            "acceptance rates), non-increasing; or mean_acceptance_length.",
        values="list of numbers in [0, 1] (one per position) or null",
    )
    mean_acceptance_length: float | None = key(
        None,
        doc="With config: tokens per verification (1 + accepted / drafts), read through the geometric model; "
            "or acceptance_rates.",
        unit="tokens",
        values="number in [1, 1 + positions] or null",
    )
    proposer_step_ms: float = key(
        0.0,
        doc="With config: one proposer pass (a draft-model pass, an EAGLE/MTP head, an n-gram lookup) per "
            "engine step with decodes.",
        values="number >= 0",
    )
    proposer_per_seq_us: float = key(
        0.0,
        doc="With config: one proposer pass, per decoding sequence.",
        values="number >= 0",
    )
    proposal_rate: float = key(
        1.0,
        doc="With config (vLLM method=ngram only): probability that a decode step's n-gram lookup finds a "
            "match and proposes; a step without one is a plain decode (query 1, one token). A declared "
            "parameter, drawn per request and step; 1: every step proposes.",
        values="number in [0, 1]",
    )
    draws: str = key(
        "request",
        doc="With config: whose stream a step's acceptance (and n-gram proposal) draw comes from. request: "
            "each request's own; prompt: one stream per prompt_id (the request table's column; absent: each "
            "request its own id), the draw of a request's step keyed on its output position, so copies of one "
            "greedy prompt accept alike at each of their own steps.",
        values="request or prompt",
    )


@dataclass(frozen=True)
class PoolConfig:
    """One pool of identical workers: the aggregated pool, or prefill or decode.

    Keys left null take the policy's own default (:mod:`simcore.scheduler.policies`).
    """

    replicas: int = key(
        1,
        doc="Identical workers (engine instances) in the pool.",
        unit="workers",
        values="integer >= 1",
    )
    attention_dp: int = key(
        1,
        doc="Data-parallel attention ranks per worker, each with its own scheduler and KV cache.",
        unit="ranks",
        values="integer >= 1",
    )
    max_batched_tokens: int | None = key(
        None,
        doc="vllm, trtllm: tokens scheduled per pass (--max-num-batched-tokens); null: the policy's default.",
        unit="tokens",
        values="integer >= 1 or null",
    )
    max_sequences: int = key(
        None,
        doc="Requests running at once per rank (--max-num-seqs); null: the policy's default.",
        unit="requests",
        values="integer >= 1 or null",
    )
    num_blocks: int = key(
        None,
        doc="KV-cache blocks per rank; null: the default KV capacity / block_size; auto: from GPU memory (aic, roofline).",
        unit="blocks",
        values="integer >= 1, auto or null",
    )
    block_size: int = key(
        None,
        doc="Tokens per KV-cache block; null: the policy's default.",
        unit="tokens",
        values="integer >= 1 or null",
    )
    context_length: int | None = key(
        None,
        doc="Longest sequence (prompt + output) a rank accepts (--max-model-len); null: the policy's default.",
        unit="tokens",
        values="integer >= 1 or null",
    )
    chunked_prefill_size: int | None = key(
        None,
        doc="sglang: prompt tokens per chunk (--chunked-prefill-size); null: the policy's default.",
        unit="tokens",
        values="integer >= 1 or null",
    )
    max_prefill_tokens: int | None = key(
        None,
        doc="sglang: prefill tokens admitted per pass (--max-prefill-tokens); null: the policy's default.",
        unit="tokens",
        values="integer >= 1 or null",
    )
    schedule_conservativeness: float | None = key(
        None,
        doc="sglang: scales the decode tokens reserved when admitting (--schedule-conservativeness); null: the policy's default.",
        values="number >= 0 or null",
    )
    prefix_caching: bool = key(
        False,
        doc="Aggregated or prefill pool: reuse the KV of cached prompt blocks (docs/prefix-caching.md).",
        values="true | false",
    )
    async_scheduling: bool = key(
        False,
        doc="vllm, aggregated or decode pool: schedule pass k + 1 while pass k runs (--async-scheduling).",
        values="true | false",
    )
    rank_policy: str = key(
        "round_robin",
        doc="How a worker spreads its requests over its attention-DP ranks (docs/routing.md).",
        values="round_robin | least_loaded",
    )
    # vllm policy with prefix_caching: a CPU tier of KV blocks (docs/prefix-caching.md); None: none
    kv_offload: KVOffloadConfig | None = section(KVOffloadConfig)
    reserve_full_isl: bool = key(
        False,
        doc="vllm: admit a waiting request only if its whole sequence fits (scheduler_reserve_full_isl).",
        values="true | false",
    )
    cache_generated_blocks: bool = key(
        False,
        doc="vllm with prefix_caching: hash the full blocks of generated tokens too.",
        values="true | false",
    )
    # None after parsing for a policy that does not use it
    chunked_prefill: bool | None = key(
        None,
        doc="vllm, trtllm: a prompt may be split over passes (false: --no-enable-chunked-prefill); null: the policy's default.",
        values="true | false | null",
    )
    # aggregated or decode pool: speculative decoding (docs/speculative.md); None after parsing: off
    speculative: Speculation | None = section(SpeculativeConfig)
    queue_order: str = key(
        "fcfs",
        doc="Order of the waiting queue (docs/semantics.md, Queue orders): fcfs (every engine's default); "
        "vllm: priority (--scheduling-policy priority: by the table's priority, lower first, then arrival; "
        "a preemption takes the lowest-priority running request); sglang: lof (--schedule-policy lof, longest "
        "output first), random (--schedule-policy random, shuffled before each extend batch from the seed), "
        "lpm (--schedule-policy lpm, longest prefix match in the radix cache before each extend batch, fcfs "
        "with more than 128 waiting; needs prefix_caching=true), dfs-weight (--schedule-policy dfs-weight, "
        "a depth-first walk of the radix tree, heavier subtrees first, before each extend batch; needs "
        "prefix_caching=true and a radix cache run as a node tree); "
        "research orders, no engine's default: shortest_prompt, shortest_output (by the "
        "table's predicted_output_tokens).",
        values="fcfs | priority | lof | random | lpm | dfs-weight | shortest_prompt | shortest_output (those the policy models)",
    )
    expert_parallel: bool = key(
        False,
        doc="vllm: --enable-expert-parallel with --data-parallel-size = attention_dp: the ranks step together "
        "through the MoE layers, an idle one running a dummy batch (docs/semantics.md).",
        values="true | false",
    )
    # The pool's own timing keys, merged over the timing section (simcore.config parses them into
    # SimConfig.pool_timing); None: the timing section as it is.
    timing: Mapping[str, Any] | None = key(
        None,
        doc="The pool's own hardware and timing: any timing.* keys (type, model, gpu, tp, roofline.*, "
        "profile, ...) merged over the timing section for this pool's workers, e.g. "
        "{gpu: H200} (docs/timing.md, Per-pool timing); null: the timing section.",
        values="mapping of timing keys or null",
    )

    @property
    def num_ranks(self) -> int:
        return self.replicas * self.attention_dp

    @property
    def sequence_limit(self) -> int:
        """SPEC §5: ``L = min(context_length, num_blocks x block_size)``."""
        capacity = self.num_blocks * self.block_size
        return capacity if self.context_length is None else min(self.context_length, capacity)


def parse_pool(
    raw: Mapping[str, Any], path: str, policy: str, timing_type: str, *, active: bool = True
) -> PoolConfig:
    """Check one pool's keys, resolving the nulls from the policy's defaults.

    Parameters
    ----------
    raw : Mapping[str, Any]
        The merged tree of the pool.
    path : str
        Its dotted path (``engine.prefill``), for messages.
    policy : str
        engine.policy (already checked).
    timing_type : str
        timing.type (already checked): ``num_blocks: auto`` needs ``aic`` or ``roofline``.
    active : bool
        Whether engine.mode uses the pool; an inactive pool's ``auto`` becomes 1
        (its keys are refused by the key scopes of :mod:`simcore.config`).

    Returns
    -------
    PoolConfig
        ``num_blocks`` is :data:`AUTO_BLOCKS` for an active ``auto`` pool, until
        :func:`simcore.derive.derive` sets it.

    Raises
    ------
    ConfigError
        A key's value is refused (its dotted path named).
    """
    defaults = policy_spec(policy).defaults
    for name, default in defaults.items():
        if default is None and raw[name] is not None:
            raise ConfigError(f"{path}.{name} is not used by engine.policy={policy}, got {raw[name]!r}")

    def pick(name: str) -> Any:
        return defaults[name] if raw[name] is None else raw[name]

    block_size = count(f"{path}.block_size", pick("block_size"))
    num_blocks = raw["num_blocks"]
    if num_blocks is None:
        if block_size > DEFAULT_KV_TOKENS:
            raise ConfigError(
                f"{path}.block_size={block_size} exceeds the default KV capacity of "
                f"{DEFAULT_KV_TOKENS} tokens per rank; set {path}.num_blocks too"
            )
        num_blocks = DEFAULT_KV_TOKENS // block_size
    elif isinstance(num_blocks, str) and num_blocks == AUTO_BLOCKS:
        if timing_type not in ("aic", "roofline"):
            raise ConfigError(
                f"{path}.num_blocks=auto derives the KV capacity from a model and a GPU and needs "
                f"timing.type=aic or roofline, got timing.type={timing_type}"
            )
        num_blocks = AUTO_BLOCKS if active else 1
    conservativeness = pick("schedule_conservativeness")
    chunk = pick("chunked_prefill_size")
    if chunk is not None and is_int(chunk) and is_int(raw["attention_dp"]) and raw["attention_dp"] >= 1:
        if chunk // raw["attention_dp"] < block_size:
            raise ConfigError(
                f"{path}.chunked_prefill_size must give every attention-DP rank at least one "
                f"page (chunked_prefill_size // attention_dp >= block_size = {block_size}), got {chunk}"
            )
    if not (isinstance(num_blocks, str) and num_blocks == AUTO_BLOCKS):
        num_blocks = checked_num_blocks(path, num_blocks, block_size)
    pool = PoolConfig(
        replicas=count(f"{path}.replicas", raw["replicas"]),
        attention_dp=count(f"{path}.attention_dp", raw["attention_dp"]),
        max_sequences=count(f"{path}.max_sequences", pick("max_sequences")),
        num_blocks=num_blocks,
        block_size=block_size,
        context_length=optional_count(f"{path}.context_length", raw["context_length"]),
        **{name: optional_count(f"{path}.{name}", pick(name)) for name in TOKEN_BUDGETS},
        prefix_caching=_prefix_caching(path, raw["prefix_caching"]),
        async_scheduling=_async_scheduling(path, raw["async_scheduling"], policy),
        rank_policy=choice(f"{path}.rank_policy", raw["rank_policy"], RANK_POLICIES),
        kv_offload=_kv_offload(path, raw, block_size, policy),
        reserve_full_isl=_reserve_full_isl(path, raw["reserve_full_isl"], policy),
        cache_generated_blocks=_cache_generated_blocks(path, raw, policy),
        chunked_prefill=_chunked_prefill(path, raw, pick("chunked_prefill"), policy),
        expert_parallel=_expert_parallel(path, raw["expert_parallel"], policy, timing_type, raw["attention_dp"]),
        queue_order=_queue_order(path, raw, policy),
        speculative=_speculative(path, raw, policy),
        schedule_conservativeness=None
        if conservativeness is None
        else number(f"{path}.schedule_conservativeness", conservativeness),  # SGLang asserts >= 0
        timing=_timing_override(f"{path}.timing", raw["timing"]),
    )
    if active and not (isinstance(num_blocks, str) and num_blocks == AUTO_BLOCKS):
        check_whole_prompt_budget(path, pool)
    return pool


def _timing_override(path: str, value: Any) -> Mapping[str, Any] | None:
    """engine.<pool>.timing: null or a mapping (its keys are checked against timing's by simcore.config)."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ConfigError(f"{path} must be a mapping of timing keys (e.g. {{gpu: H200}}) or null, got {shown(value)}")
    return value


def check_whole_prompt_budget(path: str, pool: PoolConfig) -> None:
    """With ``chunked_prefill: false``, ``max_batched_tokens`` must be at least the sequence limit L.

    vLLM refuses ``max_num_batched_tokens < max_model_len`` when chunked prefill
    is off (``SchedulerConfig.verify_max_model_len``, docs/semantics.md): a
    prompt is scheduled whole, so a longer one could never run.  L
    (:attr:`PoolConfig.sequence_limit`) plays ``max_model_len`` here.

    Parameters
    ----------
    path : str
        The pool's dotted path, for messages.
    pool : PoolConfig
        The parsed pool, its ``num_blocks`` resolved.

    Raises
    ------
    ConfigError
        The budget is below L.
    """
    if pool.chunked_prefill is False and pool.max_batched_tokens < pool.sequence_limit:
        raise ConfigError(
            f"{path}.max_batched_tokens={pool.max_batched_tokens} is below the sequence limit L = "
            f"{pool.sequence_limit} with {path}.chunked_prefill=false (vLLM requires max_num_batched_tokens "
            f">= max_model_len); raise it or set {path}.context_length"
        )


def checked_num_blocks(path: str, num_blocks: Any, block_size: int) -> int:
    """A pool's KV blocks per rank: a count whose capacity in tokens an int64 holds.

    Parameters
    ----------
    path : str
        The pool's dotted path, for messages.
    num_blocks : Any
        The configured (or derived) block count.
    block_size : int
        Tokens per block.

    Returns
    -------
    int
    """
    num_blocks = count(f"{path}.num_blocks", num_blocks)
    if num_blocks > INT64_MAX // block_size:  # the KV capacity in tokens is an int64
        raise ConfigError(
            f"{path}.num_blocks={num_blocks} x block_size={block_size} tokens exceeds int64 ({INT64_MAX})"
        )
    return num_blocks


def _unsupported(name: str, feature: str, policy: str, why: str = "") -> ConfigError:
    """The error for a pool feature the policy does not support (the registry's flag ``feature``)."""
    return ConfigError(f"{name} is modelled for engine.policy={supporting(feature)} only{why}, got {policy}")


def _policy_pool_flag(path: str, name: str, value: Any, policy: str, refused_pool: str, why: str) -> bool:
    """A pool flag modelled for the policies that support it and refused on one pool (``why`` says why)."""
    enabled = flag(f"{path}.{name}", value)
    if enabled and not supports(policy, name):
        raise _unsupported(f"{path}.{name}", name, policy)
    if enabled and path.endswith(f".{refused_pool}"):
        raise ConfigError(f"{path}.{name}: {why}")
    return enabled


def _async_scheduling(path: str, value: Any, policy: str) -> bool:
    return _policy_pool_flag(
        path, "async_scheduling", value, policy, "prefill",
        "not modelled for a P/D prefill pool (its prompts hand off instead of sampling); "
        "set it on engine.decode or engine.aggregated",
    )


def _expert_parallel(path: str, value: Any, policy: str, timing_type: str, attention_dp: Any) -> bool:
    enabled = flag(f"{path}.expert_parallel", value)
    if enabled and not supports(policy, "expert_parallel"):
        raise _unsupported(f"{path}.expert_parallel", "expert_parallel", policy)
    if enabled and timing_type not in ("fixed", "linear", "table") and attention_dp != 1:
        raise ConfigError(
            f"{path}.expert_parallel with attention_dp > 1 is modelled with timing.type=fixed, linear or table, "
            f"got timing.type={timing_type}"
        )
    return enabled


def _reserve_full_isl(path: str, value: Any, policy: str) -> bool:
    enabled = flag(f"{path}.reserve_full_isl", value)
    if enabled and not supports(policy, "reserve_full_isl"):
        raise _unsupported(f"{path}.reserve_full_isl", "reserve_full_isl", policy)
    return enabled


def _chunked_prefill(path: str, raw: Mapping[str, Any], value: Any, policy: str) -> bool | None:
    """vLLM's ``enable_chunked_prefill`` (null for a policy that does not use the key); false needs the
    policy's ``chunked_prefill`` feature and is not modelled with a CPU tier."""
    name = f"{path}.chunked_prefill"
    if value is None:
        return None
    enabled = flag(name, value)
    if not enabled and not supports(policy, "chunked_prefill"):
        raise _unsupported(f"{name}=false", "chunked_prefill", policy)
    if not enabled and any(v is not None for v in raw["kv_offload"].values()):
        raise ConfigError(f"{name}=false is not modelled with {path}.kv_offload")
    return enabled


def _queue_order(path: str, raw: Mapping[str, Any], policy: str) -> str:
    """One of the orders the policy models (fcfs for all); another order is not modelled with
    asynchronous scheduling or a CPU tier."""
    name = f"{path}.queue_order"
    order = choice(name, raw["queue_order"], QUEUE_ORDERS)
    if order not in policy_spec(policy).queue_orders:
        modelled = " or ".join(n for n, spec in SCHEDULING_POLICIES.items() if order in spec.queue_orders)
        raise ConfigError(f"{name}={order} is modelled for engine.policy={modelled} only, got {policy}")
    if order in CACHE_AWARE_ORDERS and not flag(f"{path}.prefix_caching", raw["prefix_caching"]):
        # SchedulePolicy._validate_and_adjust_policy: without the radix cache SGLang runs fcfs
        raise ConfigError(f"{name}={order} needs {path}.prefix_caching=true (without the radix cache "
                          f"SGLang runs it as fcfs)")
    if order != "fcfs":
        if raw["async_scheduling"]:
            raise ConfigError(f"{name}={order} is not modelled with {path}.async_scheduling=true")
        if any(value is not None for value in raw["kv_offload"].values()):
            raise ConfigError(f"{name}={order} is not modelled with {path}.kv_offload")
    return order


def _prefix_caching(path: str, value: Any) -> bool:
    """Every policy caches prefixes (docs/prefix-caching.md), on any pool but a P/D decode pool."""
    enabled = flag(f"{path}.prefix_caching", value)
    if enabled and path.endswith(".decode"):
        raise ConfigError(f"{path}.prefix_caching: a decode pool receives its KV by transfer; enable it on engine.prefill")
    return enabled


def _cache_generated_blocks(path: str, raw: Mapping[str, Any], policy: str) -> bool:
    """vLLM's prefix cache also keeps the full blocks of generated tokens (docs/prefix-caching.md):
    the policies that support it (SGLang's radix cache holds them already), with prefix caching, without a CPU tier."""
    name = f"{path}.cache_generated_blocks"
    enabled = flag(name, raw["cache_generated_blocks"])
    if not enabled:
        return False
    if not supports(policy, "cache_generated_blocks"):
        raise _unsupported(name, "cache_generated_blocks", policy)
    if not raw["prefix_caching"]:
        raise ConfigError(f"{name} needs {path}.prefix_caching=true")
    if any(value is not None for value in raw["kv_offload"].values()):
        raise ConfigError(f"{name} is not modelled with {path}.kv_offload (its CPU tier stores prompt blocks only)")
    return True


def _kv_offload(path: str, raw: Mapping[str, Any], block_size: int, policy: str) -> KVOffloadConfig | None:
    """All three keys set (a CPU tier) or all null (none); only beside prefix caching."""
    path = f"{path}.kv_offload"
    prefix = path.rsplit(".", 1)[0]
    keys = raw["kv_offload"]
    if all(value is None for value in keys.values()):
        return None
    for name, value in keys.items():
        if value is None:
            raise ConfigError(f"{path}.{name} must be set with the other {path} keys (all null: no CPU tier)")
    if not supports(policy, "kv_offload"):
        raise _unsupported(path, "kv_offload", policy, " (vLLM's OffloadingConnector)")
    if not raw["prefix_caching"]:
        raise ConfigError(f"{path} needs {prefix}.prefix_caching=true (the CPU tier holds prefix-cache blocks)")
    if raw["async_scheduling"]:
        raise ConfigError(f"{path} is not modelled with {prefix}.async_scheduling=true")
    if raw["reserve_full_isl"]:
        raise ConfigError(f"{path} is not modelled with {prefix}.reserve_full_isl=true")
    offload = KVOffloadConfig(
        num_blocks=count(f"{path}.num_blocks", keys["num_blocks"]),
        bandwidth_gb_per_second=number(f"{path}.bandwidth_gb_per_second", keys["bandwidth_gb_per_second"], strict=True),
        bytes_per_token=number(f"{path}.bytes_per_token", keys["bytes_per_token"], strict=True),
    )
    if not block_size * offload.bytes_per_token / (offload.bandwidth_gb_per_second * 1e9) * 1e3 < MAX_INSTANT_MS:
        raise ConfigError(f"{path}.bytes_per_token={offload.bytes_per_token!r} at bandwidth_gb_per_second="
                          f"{offload.bandwidth_gb_per_second!r}: one block's copy exceeds {MAX_INSTANT_MS:.4g} ms")
    return offload


def _speculative(path: str, raw: Mapping[str, Any], policy: str) -> Speculation | None:
    """The pool's speculative decoding from its engine form (None: off); on a token-emitting pool,
    without asynchronous scheduling or a CPU tier (not modelled together)."""
    path = f"{path}.speculative"
    keys = raw["speculative"]
    if keys["config"] is None:
        for name, value in keys.items():
            if value != default_of(SpeculativeConfig, name):
                raise ConfigError(f"{path}.{name} needs {path}.config (speculative decoding is off), got {value!r}")
        return None
    prefix = path.rsplit(".", 1)[0]
    if prefix.endswith(".prefill"):
        raise ConfigError(f"{path}: a P/D prefill pool emits no tokens; set it on engine.decode")
    if raw["async_scheduling"]:
        raise ConfigError(f"{path} is not modelled with {prefix}.async_scheduling=true")
    if any(value is not None for value in raw["kv_offload"].values()):
        raise ConfigError(f"{path} is not modelled with {prefix}.kv_offload")
    method, drafts, positions, lookahead, steps = read_engine_form(
        f"{path}.config", keys["config"], policy_spec(policy).speculative_form)
    return Speculation(
        method=method, draft_tokens=drafts, positions=positions, lookahead=lookahead, proposer_steps=steps,
        rates=acceptance_rates(path, keys["acceptance_rates"], keys["mean_acceptance_length"], positions),
        proposer_step_ms=number(f"{path}.proposer_step_ms", keys["proposer_step_ms"], maximum=MAX_INSTANT_MS),
        proposer_per_seq_us=number(f"{path}.proposer_per_seq_us", keys["proposer_per_seq_us"],
                                   maximum=MAX_INSTANT_MS),
        proposal_rate=_proposal_rate(path, keys["proposal_rate"], method, policy),
        draws=choice(f"{path}.draws", keys["draws"], SPEC_DRAWS),
    )


def _proposal_rate(path: str, value: Any, method: str, policy: str) -> float:
    """``proposal_rate`` in [0, 1]; other than 1 only for vLLM's n-gram proposer (docs/speculative.md)."""
    rate = number(f"{path}.proposal_rate", value, maximum=1.0)
    if rate != 1.0 and (policy_spec(policy).speculative_form != FORM_VLLM or method != VLLM_NGRAM):
        raise ConfigError(f"{path}.proposal_rate is modelled for vLLM's n-gram proposer only (method=ngram), "
                          f"got {rate!r} with {method}")
    return rate
