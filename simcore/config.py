"""Run configuration: defaults, validation and frozen dataclasses.

The configuration is a nested mapping with the same shape as the Hydra config
(``runners/conf/``).  :func:`load_config` merges a user mapping over :data:`DEFAULTS`,
checks every value once, and returns a :class:`SimConfig` of frozen
dataclasses.  Errors are :class:`ConfigError` naming the dotted field, the value
and what is allowed.  This module never imports Hydra.
"""

from __future__ import annotations

import copy
import math
import os
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping

import numpy as np

from simcore import bounds
from simcore.enums import RANK_POLICIES, ROUTER_POLICIES
from simcore.errors import ConfigError, InstantOverflow  # noqa: F401  raised and caught as simcore.config.*
from simcore.metrics.registry import slo_metrics
from simcore.timing import aic
from simcore.timing.profile import read_num_layers
from simcore.units import INT64_MAX, MAX_INSTANT_MS


# Linear timing coefficients for an H100-class GPU serving an 8B dense model:
# a pass reads the 16 GB of weights (~5 ms at 3.35 TB/s), a prompt token costs
# ~2 x 8e9 FLOP (~30 us at ~550 dense TFLOP/s), a KV token read of 128 KiB costs
# ~40 ns, and each decoding sequence adds sampling/bookkeeping overhead.
# num_blocks: (80 GB x 0.9 - 16 GB weights) / 128 KiB per token / 16 per block.
# Pool keys left null take the policy's own default (POLICY_DEFAULTS).
_POOL_DEFAULTS = {
    "replicas": 1,
    "attention_dp": 1,
    "max_batched_tokens": None,
    "max_sequences": None,
    "num_blocks": None,
    "block_size": None,
    "context_length": None,
    "chunked_prefill_size": None,
    "max_prefill_tokens": None,
    "schedule_conservativeness": None,
    "prefix_caching": False,
    # vllm policy: schedule pass k + 1 while pass k runs (docs/semantics.md)
    "async_scheduling": False,
    # how a worker spreads its requests over its attention-DP ranks (docs/routing.md)
    "rank_policy": "round_robin",
    # vllm policy with prefix_caching: a CPU tier of KV blocks (docs/prefix-caching.md)
    "kv_offload": {"num_blocks": None, "bandwidth_gb_per_second": None, "bytes_per_token": None},
    # vllm policy: admit a waiting request only if its whole sequence fits (docs/semantics.md)
    "reserve_full_isl": False,
    # vllm policy with prefix_caching: hash the full blocks of generated tokens too (docs/prefix-caching.md)
    "cache_generated_blocks": False,
}

#: KV capacity of a rank when num_blocks is null, tokens: an 8B dense model on
#: an 80 GB GPU at 0.9 memory utilisation, (80 x 0.9 - 16) GB / 128 KiB per token.
DEFAULT_KV_TOKENS = 416_000

#: Per-policy defaults of the pool keys, from each engine's own defaults:
#: vLLM (V1 engine, 0.11: block_size 16, max_num_seqs 256, max_num_batched_tokens
#: 8192 for the API server); SGLang (0.5: page_size 1, chunked_prefill_size 8192,
#: max_prefill_tokens 16384, schedule_conservativeness 1.0; max_running_requests
#: is derived from memory there, 4096 here); TensorRT-LLM (1.0: tokens_per_block
#: 32, max_num_tokens 8192, max_batch_size 2048).  None: the key is not used.
POLICY_DEFAULTS = {
    "vllm": {
        "max_batched_tokens": 8192,
        "max_sequences": 256,
        "block_size": 16,
        "chunked_prefill_size": None,
        "max_prefill_tokens": None,
        "schedule_conservativeness": None,
    },
    "sglang": {
        "max_batched_tokens": None,
        "max_sequences": 4096,
        "block_size": 1,
        "chunked_prefill_size": 8192,
        "max_prefill_tokens": 16384,
        "schedule_conservativeness": 1.0,
    },
    "trtllm": {
        "max_batched_tokens": 8192,
        "max_sequences": 2048,
        "block_size": 32,
        "chunked_prefill_size": None,
        "max_prefill_tokens": None,
        "schedule_conservativeness": None,
    },
}

DEFAULTS: dict[str, Any] = {
    "seed": 0,
    "workload": {
        "source": "synthetic",
        "path": None,
        "num_requests": 640,
        "input_tokens": 1024,
        "output_tokens": 128,
        "input_dist": "fixed",
        "output_dist": "fixed",
        "range_ratio": 1.0,
        "input_std": 0.0,
        "output_std": 0.0,
        # Trace sources (mooncake, azure) only; see simcore/workload/traces.py.
        "block_size": None,  # mooncake hash_ids block, tokens; null: 512
        "drop_invalid": False,
        "max_requests": None,
        "time_window_ms": None,
        # Synthetic only: every prompt starts with this many identical tokens.
        "prefix_tokens": 0,
        # workload.source=shared_prefix only: inference-perf's recurring prompts
        # (simcore/workload/shared_prefix.py); its names and defaults.
        "shared_prefix": {
            "num_groups": 10,
            "num_prompts_per_group": 10,
            "system_prompt_len": 100,
            "question_len": 50,
            "output_len": 50,
            "seed": None,  # null: drawn from the run's generator (seed)
        },
        # Multi-turn sessions (simcore/workload/sessions.py): workload.source=sessions
        # generates them; think_time_ms also paces a table's session_id/turn rows.
        # Defaults: AISimulate's synthetic-session source (4 turns of 1024 new input
        # and 128 output tokens, no delay), 160 sessions = the default 640 requests.
        "sessions": {
            "num_sessions": 160,
            "turns": 4,
            "turns_dist": "fixed",  # fixed | uniform (1..turns) | geometric (mean turns)
            "new_input_tokens": 1024,
            "output_tokens": 128,
            "think_time_ms": 0.0,  # client's pause between a turn's last receipt and the next turn
            "system_prompt_tokens": 0,  # shared by every session's first prompt
        },
    },
    "load": {
        "type": "closed_loop",
        "concurrency": 64,
        "request_rate": None,
        "burstiness": 1.0,
        "think_time_ms": 0.0,
        "speedup": 1.0,
    },
    "engine": {
        "mode": "aggregated",
        "policy": "vllm",
        # Separate copies, nested kv_offload included: deepcopy would keep one shared dict shared.
        "aggregated": copy.deepcopy(_POOL_DEFAULTS),
        "prefill": copy.deepcopy(_POOL_DEFAULTS),
        "decode": copy.deepcopy(_POOL_DEFAULTS),
        "kv_transfer": {"bandwidth_gb_per_second": None, "bytes_per_token": None},
        # Routing over workers (docs/routing.md): the receiving pool (aggregated
        # or P/D prefill), then the P/D decode pool; weights of prefix_aware's
        # scorers (llm-d's no-config default: prefix 3, queue 2, kv-cache 2).
        "router": {"policy": "round_robin", "weights": {"prefix": 3.0, "queue": 2.0, "kv_cache": 2.0}},
        "decode_router": {"policy": "round_robin"},
    },
    "timing": {
        "type": "linear",
        "prefill_ms": 30.0,
        "decode_ms": 8.0,
        "base_ms": 5.0,
        "per_prefill_token_us": 30.0,
        "per_decode_seq_us": 20.0,
        "per_kv_token_ns": 40.0,
        # aic (aiconfigurator-core database; docs/timing.md)
        "model": None,  # bundled HF id or a local directory holding config.json
        "gpu": None,  # AIC system name, e.g. h200_sxm
        "backend": None,  # vllm | sglang | trtllm; null: engine.policy
        "backend_version": None,  # null: the database's current version
        "tp": None,  # tensor parallelism of one rank (aic; linear/table/aic: timing.allreduce); null: 1
        "memory_fraction": None,  # num_blocks: auto; null: 0.9 (see AIC_MEMORY_FRACTION)
        # table (per-operator profile; docs/timing.md)
        "profile": None,  # directory with dense.csv, attention.csv, per_sequence.csv
        "num_layers": None,  # null: num_layers of the profile's meta.yaml
        # TP all-reduce (docs/timing.md); unset: none added (aic: the database's own)
        "hidden_size": None,  # null: meta.yaml hidden_size (table), the model config (aic)
        "dtype_bytes": 2,  # bytes per activation element (bf16)
        "allreduce": {"latency_us": None, "bandwidth_gb_per_second": None, "curve": None},
        # linear, table, aic: factors on the model's pass time and a per-pass overhead
        "prefill_scale": 1.0,  # passes with a prefill entry
        "decode_scale": 1.0,  # decode-only passes
        "pass_overhead_us": 0.0,
        # linear, table, aic: CUDA-graph capture sizes (null: none, a list, or vllm_default)
        "cuda_graph_sizes": None,
        # linear, table: share of the decode attention's gap from the mean to the longest
        # context added for batches of mixed lengths (docs/timing.md)
        "attention_skew_alpha": 0.0,
    },
    "tokenization": {"workers": 1, "base_ms": 0.0, "per_input_us": 0.0},
    "detokenization": {
        "workers": 1,
        "base_ms": 0.0,
        "per_output_us": 0.0,
        "chunk_size": None,
        "first_output_us": 0.0,
        "final_output_us": 0.0,
    },
    "max_time_ms": None,
    "metrics": {
        "percentiles": [50, 90, 95, 99],
        "goodput": {metric.column: None for metric in slo_metrics()},
    },
    "output": {"dir": None, "passes": False, "tokens": False, "mode": "detailed"},
}

WORKLOAD_SOURCES = ("synthetic", "table", "mooncake", "azure", "shared_prefix", "sessions")
#: Sources whose requests are drawn from keys (sized by them before anything is drawn).
GENERATED_SOURCES = ("synthetic", "shared_prefix")
OUTPUT_MODES = ("detailed", "bounded")
FILE_SOURCES = ("table", "mooncake", "azure")
TRACE_SOURCES = ("mooncake", "azure")
#: Tokens per ``hash_ids`` block of a Mooncake trace when workload.block_size is null.
MOONCAKE_BLOCK_SIZE = 512
#: The trace-only workload keys and their defaults (set with another source: an error).
TRACE_KEYS = ("block_size", "drop_invalid", "max_requests", "time_window_ms")
LENGTH_DISTS = ("fixed", "uniform", "normal", "lognormal")
LOAD_TYPES = ("closed_loop", "constant_rate", "poisson", "gamma", "trace")
OPEN_LOOP_GENERATED = ("constant_rate", "poisson", "gamma")
ENGINE_MODES = ("aggregated", "disaggregated")
POOLS = {"aggregated": ("aggregated",), "disaggregated": ("prefill", "decode")}
POLICIES = tuple(POLICY_DEFAULTS)
#: The decode pool has no prefix cache: load-based and oblivious choices only.
DECODE_ROUTER_POLICIES = tuple(p for p in ROUTER_POLICIES if p != "prefix_aware")
ROUTER_WEIGHTS = ("prefix", "queue", "kv_cache")
TIMING_TYPES = ("fixed", "linear", "aic", "table")
#: The timing keys of each table-driven model (set with another timing.type: an error).
AIC_KEYS = ("model", "gpu", "backend", "backend_version", "memory_fraction")
TABLE_KEYS = ("profile",)
#: Timing types that can add a TP all-reduce term (timing.allreduce; for aic it
#: replaces the database's own per-layer all-reduces).
ALLREDUCE_TYPES = ("linear", "table", "aic")
#: The coefficients of the two closed-form timing models.
FIXED_KEYS = ("prefill_ms", "decode_ms")
LINEAR_KEYS = ("base_ms", "per_prefill_token_us", "per_decode_seq_us", "per_kv_token_ns")
#: The workload keys only synthetic lengths read (prefix_tokens is checked on its own).
SYNTHETIC_KEYS = (
    "input_tokens", "output_tokens", "input_dist", "output_dist", "range_ratio", "input_std", "output_std"
)
#: Fraction of GPU memory given to weights plus KV cache for ``num_blocks: auto``
#: when timing.memory_fraction is null: vLLM's gpu_memory_utilization and
#: TensorRT-LLM's free_gpu_memory_fraction default to 0.9 (SGLang derives its
#: mem_fraction_static from the GPU; 0.9 stands in for it).
AIC_MEMORY_FRACTION = 0.9
#: timing.cuda_graph_sizes value that asks for vLLM's own default capture sizes.
VLLM_DEFAULT_GRAPHS = "vllm_default"
#: The string ``engine.<pool>.num_blocks`` accepts with timing.type=aic.
AUTO_BLOCKS = "auto"


def dotted_keys(tree: Mapping[str, Any] = DEFAULTS, prefix: str = "") -> list[str]:
    """Every leaf key of ``tree`` as a dotted path (``engine.aggregated.replicas``).

    Parameters
    ----------
    tree : Mapping[str, Any]
        A nested configuration mapping; default :data:`DEFAULTS`.
    prefix : str
        Prepended to every path (used by the recursion).

    Returns
    -------
    list of str
        Dotted leaf paths, in the mapping's order.
    """
    keys = []
    for name, value in tree.items():
        path = f"{prefix}{name}"
        if isinstance(value, Mapping):
            keys.extend(dotted_keys(value, path + "."))
        else:
            keys.append(path)
    return keys


def merge_config(user: Mapping[str, Any] | None) -> dict[str, Any]:
    """Merge ``user`` over :data:`DEFAULTS`; unknown keys are a ConfigError.

    Parameters
    ----------
    user : Mapping[str, Any] or None
        Nested user overrides (None: the defaults).

    Returns
    -------
    dict[str, Any]
        A deep copy of the defaults with ``user`` merged in (not validated).
    """
    merged = _copied_tree(DEFAULTS)
    if user is not None:
        _merge_into(merged, user, "")
    return merged


def _copied_tree(value: Any) -> Any:
    """``copy.deepcopy`` of nested dicts and lists of immutable scalars, several times faster (a copy per sweep point)."""
    if isinstance(value, dict):
        return {name: _copied_tree(item) for name, item in value.items()}
    if isinstance(value, list):
        return [_copied_tree(item) for item in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return copy.deepcopy(value)


def _merge_into(base: dict, user: Mapping, prefix: str) -> None:
    if not isinstance(user, Mapping):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'} must be a mapping, got {user!r}")
    for name, value in user.items():
        path = f"{prefix}{name}"
        if name not in base:
            allowed = ", ".join(sorted(base))
            raise ConfigError(f"{path} is not a known key (allowed here: {allowed})")
        if isinstance(base[name], dict):
            if not isinstance(value, Mapping):
                raise ConfigError(f"{path} must be a mapping, got {value!r}")
            _merge_into(base[name], value, path + ".")
        else:
            base[name] = _copied_tree(value)


# ---------------------------------------------------------------- value checks


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(
        value, (bool, np.bool_)
    )


def _count(path: str, value: Any, minimum: int = 1) -> int:
    if not _is_int(value) or value < minimum:
        raise ConfigError(f"{path} must be an integer >= {minimum}, got {_shown(value)}")
    if value > INT64_MAX:
        raise ConfigError(f"{path} must be an integer <= {INT64_MAX} (int64), got {_shown(value)}")
    return int(value)


def _shown(value: Any) -> str:
    """``repr`` of a value for a one-line message, a huge integer abbreviated."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:20]}...{text[-8:]} ({len(text)} characters)"


def _optional_count(path: str, value: Any, minimum: int = 1) -> int | None:
    return None if value is None else _count(path, value, minimum)


def _number(
    path: str, value: Any, *, minimum: float = 0.0, strict: bool = False, maximum: float = math.inf
) -> float:
    try:
        finite = _is_number(value) and math.isfinite(float(value))
    except OverflowError:  # an integer beyond float64
        finite = False
    if not finite:
        raise ConfigError(f"{path} must be a finite number, got {_shown(value)}")
    value = float(value)
    if value > maximum:
        raise ConfigError(f"{path} must be <= {maximum:.4g}, got {value!r}")
    if strict and value <= minimum:
        raise ConfigError(f"{path} must be > {minimum:g}, got {value!r}")
    if not strict and value < minimum:
        raise ConfigError(f"{path} must be >= {minimum:g}, got {value!r}")
    return value


def _optional_number(path: str, value: Any, **kwargs: Any) -> float | None:
    return None if value is None else _number(path, value, **kwargs)


def _choice(path: str, value: Any, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ConfigError(f"{path} must be one of {', '.join(allowed)}; got {value!r}")
    return value


def _flag(path: str, value: Any) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise ConfigError(f"{path} must be true or false, got {value!r}")
    return bool(value)


# ---------------------------------------------------------------- sections


@dataclass(frozen=True)
class WorkloadConfig:
    source: str
    path: str | None
    num_requests: int | None
    input_tokens: int
    output_tokens: int
    input_dist: str
    output_dist: str
    range_ratio: float
    input_std: float
    output_std: float
    block_size: int | None  # mooncake: tokens per hash_ids block (512 when left null)
    drop_invalid: bool
    max_requests: int | None
    time_window_ms: float | None
    prefix_tokens: int
    shared_prefix: SharedPrefixConfig
    sessions: SessionsConfig


@dataclass(frozen=True)
class SharedPrefixConfig:
    """inference-perf's ``shared_prefix`` workload: G groups of P prompts, each a
    group's system prompt followed by its own question (docs/semantics.md)."""

    num_groups: int
    num_prompts_per_group: int
    system_prompt_len: int  # tokens shared by the prompts of a group (0: none)
    question_len: int  # tokens of each prompt's own question
    output_len: int
    seed: int | None  # None: the run's generator

    @property
    def num_prompts(self) -> int:
        return self.num_groups * self.num_prompts_per_group

    @property
    def input_tokens(self) -> int:
        return self.system_prompt_len + self.question_len

    @property
    def hash_block_tokens(self) -> int:
        """Tokens per ``hash_ids`` entry: the system prompt is one entry, so that
        every engine block inside it is shared by the group, whatever its size."""
        return self.system_prompt_len or self.question_len

    @property
    def hash_blocks(self) -> int:
        """``hash_ids`` entries per prompt."""
        return -(-self.input_tokens // self.hash_block_tokens)


SESSION_TURNS_DISTS = ("fixed", "uniform", "geometric")


@dataclass(frozen=True)
class SessionsConfig:
    """Multi-turn sessions (docs/semantics.md, Sessions): each turn's prompt is the
    previous turn's prompt and answer plus ``new_input_tokens``."""

    num_sessions: int
    turns: int  # turns per session (fixed), the most (uniform) or the mean (geometric)
    turns_dist: str
    new_input_tokens: int
    output_tokens: int
    think_time_ms: float
    system_prompt_tokens: int


@dataclass(frozen=True)
class LoadConfig:
    type: str
    concurrency: int
    request_rate: float | None
    burstiness: float
    think_time_ms: float
    speedup: float

    @property
    def closed_loop(self) -> bool:
        return self.type == "closed_loop"


@dataclass(frozen=True)
class PoolConfig:
    """One pool of identical workers: the aggregated pool, or prefill or decode."""

    replicas: int
    attention_dp: int
    max_batched_tokens: int | None  # vllm, trtllm: the per-pass token budget
    max_sequences: int
    num_blocks: int
    block_size: int
    context_length: int | None
    chunked_prefill_size: int | None  # sglang
    max_prefill_tokens: int | None  # sglang
    schedule_conservativeness: float | None  # sglang
    prefix_caching: bool  # aggregated or prefill pool (docs/prefix-caching.md)
    async_scheduling: bool = False  # vllm, aggregated or decode pool (docs/semantics.md)
    rank_policy: str = "round_robin"  # RANK_POLICIES (docs/routing.md)
    kv_offload: "KVOffloadConfig | None" = None  # CPU tier (docs/prefix-caching.md); None: none
    reserve_full_isl: bool = False  # vllm (docs/semantics.md)
    cache_generated_blocks: bool = False  # vllm with prefix_caching (docs/prefix-caching.md)

    @property
    def num_ranks(self) -> int:
        return self.replicas * self.attention_dp

    @property
    def sequence_limit(self) -> int:
        """SPEC §5: ``L = min(context_length, num_blocks x block_size)``."""
        capacity = self.num_blocks * self.block_size
        return capacity if self.context_length is None else min(self.context_length, capacity)


@dataclass(frozen=True)
class KVTransferConfig:
    bandwidth_gb_per_second: float | None
    bytes_per_token: float | None

    def transfer_ms(self, input_tokens: np.ndarray) -> np.ndarray:
        """SPEC §6: ``input x bytes_per_token / (bandwidth x 1e9) x 1e3`` ms (0 when off)."""
        if self.bandwidth_gb_per_second is None:
            return np.zeros(input_tokens.shape[0], dtype=np.float64)
        return (
            input_tokens.astype(np.float64)
            * self.bytes_per_token
            / (self.bandwidth_gb_per_second * 1e9)
            * 1e3
        )


@dataclass(frozen=True)
class RouterConfig:
    """Routing over workers (docs/routing.md): names in ``simcore.enums.ROUTER_POLICIES``."""

    policy: str = "round_robin"  # the receiving pool (aggregated, or P/D prefill)
    decode_policy: str = "round_robin"  # the P/D decode pool
    weights: tuple[float, float, float] = (3.0, 2.0, 2.0)  # prefix_aware: prefix, queue, kv_cache


@dataclass(frozen=True)
class EngineConfig:
    mode: str
    policy: str
    aggregated: PoolConfig
    prefill: PoolConfig
    decode: PoolConfig
    kv_transfer: KVTransferConfig
    router: RouterConfig = RouterConfig()

    @property
    def pools(self) -> tuple[PoolConfig, ...]:
        """The pools in worker-index order (aggregated; or prefill, then decode)."""
        return tuple(getattr(self, name) for name in POOLS[self.mode])


@dataclass(frozen=True)
class TimingConfig:
    type: str
    prefill_ms: float
    decode_ms: float
    base_ms: float
    per_prefill_token_us: float
    per_decode_seq_us: float
    per_kv_token_ns: float
    # aic: resolved (backend from engine.policy, tp 1, memory_fraction 0.9); None otherwise.
    model: str | None = None
    gpu: str | None = None
    backend: str | None = None
    backend_version: str | None = None
    tp: int | None = None
    memory_fraction: float | None = None
    # table
    profile: str | None = None
    num_layers: int | None = None
    # TP all-reduce (linear, table, aic): ring (latency + 2(n-1)/n x bytes / bandwidth)
    # or a measured curve; both None: none added (aic: the database's own).
    hidden_size: int | None = None
    dtype_bytes: int = 2
    allreduce_latency_us: float | None = None
    allreduce_bandwidth_gb_per_second: float | None = None
    allreduce_curve: str | None = None
    # linear, table, aic: model time x scale (prefill passes / decode-only passes) + overhead
    prefill_scale: float = 1.0
    decode_scale: float = 1.0
    pass_overhead_us: float = 0.0
    # linear, table, aic: passes of at most max(sizes) tokens run at the smallest size >= their
    # tokens (ascending, unique; None: no padding; VLLM_DEFAULT_GRAPHS until the pools resolve it)
    cuda_graph_sizes: tuple[int, ...] | str | None = None
    # linear, table: decode attention + alpha x (at the longest context - at the mean)
    attention_skew_alpha: float = 0.0

    @property
    def allreduce(self) -> bool:
        """Whether timing.allreduce adds (or, for aic, replaces) the TP all-reduce time."""
        return self.allreduce_bandwidth_gb_per_second is not None or self.allreduce_curve is not None
    # aic: the largest pass the tables must cover, from the engine pools (not user keys):
    # tokens per pass (budget + sequences), sequences per pass, tokens per sequence.
    pass_tokens_limit: int | None = None
    pass_sequences_limit: int | None = None
    context_limit: int | None = None


@dataclass(frozen=True)
class TokenizationConfig:
    workers: int
    base_ms: float
    per_input_us: float

    @property
    def enabled(self) -> bool:
        return self.base_ms > 0 or self.per_input_us > 0


@dataclass(frozen=True)
class DetokenizationConfig:
    workers: int
    base_ms: float
    per_output_us: float
    chunk_size: int | None
    first_output_us: float
    final_output_us: float

    @property
    def enabled(self) -> bool:
        return (
            self.base_ms > 0
            or self.per_output_us > 0
            or self.first_output_us > 0
            or self.final_output_us > 0
        )


@dataclass(frozen=True)
class GoodputConfig:
    """Per-request targets, ms (None: none), by the column of each ``registry.slo_metrics()`` metric."""

    targets: tuple[tuple[str, float | None], ...]

    def target(self, column: str) -> float | None:
        return dict(self.targets)[column]

    @property
    def enabled(self) -> bool:
        return any(v is not None for _, v in self.targets)


@dataclass(frozen=True)
class MetricsConfig:
    percentiles: tuple[float, ...]
    goodput: GoodputConfig


@dataclass(frozen=True)
class OutputConfig:
    dir: str | None
    passes: bool
    tokens: bool
    mode: str  # detailed: per-token arrays; bounded: O(requests) memory, ITL percentiles sketched


@dataclass(frozen=True)
class SimConfig:
    seed: int
    workload: WorkloadConfig
    load: LoadConfig
    engine: EngineConfig
    timing: TimingConfig
    tokenization: TokenizationConfig
    detokenization: DetokenizationConfig
    max_time_ms: float | None
    metrics: MetricsConfig
    output: OutputConfig
    resolved: dict  # the merged mapping, for summary.json

    def __post_init__(self) -> None:
        _check_combinations(self)


def load_config(user: Mapping[str, Any] | None = None) -> SimConfig:
    """Merge ``user`` over the defaults, validate every field and freeze it.

    Parameters
    ----------
    user : Mapping[str, Any] or None
        Nested user overrides (None: the defaults).

    Returns
    -------
    SimConfig
        The validated, frozen configuration (``resolved`` holds the merged mapping).

    Raises
    ------
    ConfigError
        An unknown key, a bad value or an invalid combination.
    """
    raw = merge_config(user)
    w, ld, e, t = raw["workload"], raw["load"], raw["engine"], raw["timing"]
    tok, detok, m = raw["tokenization"], raw["detokenization"], raw["metrics"]
    seed = _count("seed", raw["seed"], minimum=0)
    shared_prefix = _shared_prefix(w["shared_prefix"])
    sections = dict(
        workload=WorkloadConfig(
            source=_choice("workload.source", w["source"], WORKLOAD_SOURCES),
            path=_optional_str("workload.path", w["path"]),
            num_requests=_optional_count("workload.num_requests", w["num_requests"]),
            input_tokens=_count("workload.input_tokens", w["input_tokens"]),
            output_tokens=_count("workload.output_tokens", w["output_tokens"]),
            input_dist=_choice("workload.input_dist", w["input_dist"], LENGTH_DISTS),
            output_dist=_choice("workload.output_dist", w["output_dist"], LENGTH_DISTS),
            range_ratio=_range_ratio(w["range_ratio"]),
            input_std=_number("workload.input_std", w["input_std"]),
            output_std=_number("workload.output_std", w["output_std"]),
            block_size=_trace_block_size(w, shared_prefix),
            drop_invalid=_flag("workload.drop_invalid", w["drop_invalid"]),
            max_requests=_optional_count("workload.max_requests", w["max_requests"]),
            time_window_ms=_optional_number(
                "workload.time_window_ms", w["time_window_ms"], strict=True, maximum=MAX_INSTANT_MS
            ),
            prefix_tokens=_count("workload.prefix_tokens", w["prefix_tokens"], minimum=0),
            shared_prefix=shared_prefix,
            sessions=_sessions(w["sessions"]),
        ),
        load=LoadConfig(
            type=_choice("load.type", ld["type"], LOAD_TYPES),
            concurrency=_count("load.concurrency", ld["concurrency"]),
            request_rate=_optional_number("load.request_rate", ld["request_rate"], strict=True),
            burstiness=_number("load.burstiness", ld["burstiness"], strict=True),
            think_time_ms=_number("load.think_time_ms", ld["think_time_ms"]),
            speedup=_number("load.speedup", ld["speedup"], strict=True),
        ),
    )
    mode = _choice("engine.mode", e["mode"], ENGINE_MODES)
    policy = _choice("engine.policy", e["policy"], POLICIES)
    timing = _timing(t, policy)
    pools = {
        name: _pool(f"engine.{name}", e[name], policy, timing, active=name in POOLS[mode])
        for name in ("aggregated", "prefill", "decode")
    }
    if timing.type == "aic":
        timing = replace(timing, **_aic_limits([pools[name] for name in POOLS[mode]]))
    if timing.cuda_graph_sizes == VLLM_DEFAULT_GRAPHS:
        timing = replace(timing, cuda_graph_sizes=vllm_graph_sizes([pools[name] for name in POOLS[mode]]))
    return SimConfig(
        seed=seed,
        **sections,
        engine=EngineConfig(
            mode=mode,
            policy=policy,
            aggregated=pools["aggregated"],
            prefill=pools["prefill"],
            decode=pools["decode"],
            kv_transfer=KVTransferConfig(
                bandwidth_gb_per_second=_optional_number(
                    "engine.kv_transfer.bandwidth_gb_per_second",
                    e["kv_transfer"]["bandwidth_gb_per_second"],
                    strict=True,
                ),
                bytes_per_token=_optional_number(
                    "engine.kv_transfer.bytes_per_token", e["kv_transfer"]["bytes_per_token"]
                ),
            ),
            router=_router(e["router"], e["decode_router"]),
        ),
        timing=timing,
        tokenization=TokenizationConfig(
            workers=_count("tokenization.workers", tok["workers"]),
            base_ms=_number("tokenization.base_ms", tok["base_ms"]),
            per_input_us=_number("tokenization.per_input_us", tok["per_input_us"]),
        ),
        detokenization=DetokenizationConfig(
            workers=_count("detokenization.workers", detok["workers"]),
            base_ms=_number("detokenization.base_ms", detok["base_ms"]),
            per_output_us=_number("detokenization.per_output_us", detok["per_output_us"]),
            chunk_size=_optional_count("detokenization.chunk_size", detok["chunk_size"]),
            first_output_us=_number("detokenization.first_output_us", detok["first_output_us"]),
            final_output_us=_number("detokenization.final_output_us", detok["final_output_us"]),
        ),
        max_time_ms=_optional_number("max_time_ms", raw["max_time_ms"], maximum=MAX_INSTANT_MS),
        metrics=MetricsConfig(
            percentiles=_percentiles(m["percentiles"]),
            goodput=GoodputConfig(tuple(
                (key, _optional_number(f"metrics.goodput.{key}", m["goodput"][key], strict=True))
                for key in (metric.column for metric in slo_metrics())
            )),
        ),
        output=OutputConfig(
            dir=_optional_str("output.dir", raw["output"]["dir"]),
            passes=_flag("output.passes", raw["output"]["passes"]),
            tokens=_flag("output.tokens", raw["output"]["tokens"]),
            mode=_choice("output.mode", raw["output"]["mode"], OUTPUT_MODES),
        ),
        resolved=raw,
    )


def _optional_str(path: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{path} must be a non-empty string, got {value!r}")
    return value


def _trace_block_size(raw: Mapping[str, Any], shared_prefix: SharedPrefixConfig) -> int | None:
    """Tokens per ``hash_ids`` entry: workload.block_size, with the Mooncake default when
    null; the generated entries' size for shared_prefix (None for other sources)."""
    value = raw["block_size"]
    if raw["source"] == "shared_prefix":  # a set workload.block_size is refused by KEY_SCOPES
        return shared_prefix.hash_block_tokens
    if value is None:
        return MOONCAKE_BLOCK_SIZE if raw["source"] == "mooncake" else None
    return _count("workload.block_size", value)


def _shared_prefix(raw: Mapping[str, Any]) -> SharedPrefixConfig:
    path = "workload.shared_prefix"
    cfg = SharedPrefixConfig(
        num_groups=_count(f"{path}.num_groups", raw["num_groups"]),
        num_prompts_per_group=_count(f"{path}.num_prompts_per_group", raw["num_prompts_per_group"]),
        system_prompt_len=_count(f"{path}.system_prompt_len", raw["system_prompt_len"], minimum=0),
        question_len=_count(f"{path}.question_len", raw["question_len"]),
        output_len=_count(f"{path}.output_len", raw["output_len"]),
        seed=_optional_count(f"{path}.seed", raw["seed"], minimum=0),
    )
    if cfg.input_tokens > INT64_MAX:  # the prompt length is an int64
        raise ConfigError(
            f"{path}.question_len: system_prompt_len + question_len = {cfg.input_tokens} tokens exceeds int64"
        )
    return cfg


def _sessions(raw: Mapping[str, Any]) -> SessionsConfig:
    path = "workload.sessions"
    return SessionsConfig(
        num_sessions=_count(f"{path}.num_sessions", raw["num_sessions"]),
        turns=_count(f"{path}.turns", raw["turns"]),
        turns_dist=_choice(f"{path}.turns_dist", raw["turns_dist"], SESSION_TURNS_DISTS),
        new_input_tokens=_count(f"{path}.new_input_tokens", raw["new_input_tokens"]),
        output_tokens=_count(f"{path}.output_tokens", raw["output_tokens"]),
        think_time_ms=_number(f"{path}.think_time_ms", raw["think_time_ms"], maximum=MAX_INSTANT_MS),
        system_prompt_tokens=_count(f"{path}.system_prompt_tokens", raw["system_prompt_tokens"], minimum=0),
    )


def _range_ratio(value: Any) -> float:
    ratio = _number("workload.range_ratio", value, strict=True)
    if ratio > 1:
        raise ConfigError(f"workload.range_ratio must be in (0, 1], got {value!r}")
    return ratio


def _percentiles(value: Any) -> tuple[float, ...]:
    if isinstance(value, (str, bytes, Mapping)) or not hasattr(value, "__iter__"):
        raise ConfigError(f"metrics.percentiles must be a list of numbers in [0, 100], got {value!r}")
    out = []
    for item in value:
        p = _number("metrics.percentiles", item)
        if p > 100:
            raise ConfigError(f"metrics.percentiles values must be in [0, 100], got {item!r}")
        out.append(p)
    if len(set(out)) != len(out):
        raise ConfigError(f"metrics.percentiles must not repeat a value, got {list(value)!r}")
    return tuple(out)


def _pool(
    prefix: str, raw: Mapping[str, Any], policy: str, timing: TimingConfig, *, active: bool = True
) -> PoolConfig:
    defaults = POLICY_DEFAULTS.get(policy, POLICY_DEFAULTS["vllm"])
    for key, default in defaults.items():
        if default is None and raw[key] is not None:
            raise ConfigError(f"{prefix}.{key} is not used by engine.policy={policy}, got {raw[key]!r}")

    def pick(key: str) -> Any:
        return defaults[key] if raw[key] is None else raw[key]

    block_size = _count(f"{prefix}.block_size", pick("block_size"))
    num_blocks = raw["num_blocks"]
    if num_blocks is None:
        if block_size > DEFAULT_KV_TOKENS:
            raise ConfigError(
                f"{prefix}.block_size={block_size} exceeds the default KV capacity of "
                f"{DEFAULT_KV_TOKENS} tokens per rank; set {prefix}.num_blocks too"
            )
        num_blocks = DEFAULT_KV_TOKENS // block_size
    elif isinstance(num_blocks, str) and num_blocks == AUTO_BLOCKS:
        if timing.type != "aic":
            raise ConfigError(
                f"{prefix}.num_blocks=auto derives the KV capacity from the aiconfigurator-core "
                f"database and needs timing.type=aic, got timing.type={timing.type}"
            )
        # An unused pool's keys are rejected by _check_combinations.
        num_blocks = _auto_num_blocks(prefix, raw, defaults, timing, block_size) if active else 1
    optional_counts = ("max_batched_tokens", "chunked_prefill_size", "max_prefill_tokens")
    conservativeness = pick("schedule_conservativeness")
    chunk = pick("chunked_prefill_size")
    if chunk is not None and _is_int(chunk) and _is_int(raw["attention_dp"]) and raw["attention_dp"] >= 1:
        if chunk // raw["attention_dp"] < block_size:
            raise ConfigError(
                f"{prefix}.chunked_prefill_size must give every attention-DP rank at least one "
                f"page (chunked_prefill_size // attention_dp >= block_size = {block_size}), got {chunk}"
            )
    num_blocks = _count(f"{prefix}.num_blocks", num_blocks)
    if num_blocks > INT64_MAX // block_size:  # the KV capacity in tokens is an int64
        raise ConfigError(
            f"{prefix}.num_blocks={num_blocks} x block_size={block_size} tokens exceeds int64 ({INT64_MAX})"
        )
    return PoolConfig(
        replicas=_count(f"{prefix}.replicas", raw["replicas"]),
        attention_dp=_count(f"{prefix}.attention_dp", raw["attention_dp"]),
        max_sequences=_count(f"{prefix}.max_sequences", pick("max_sequences")),
        num_blocks=num_blocks,
        block_size=block_size,
        context_length=_optional_count(f"{prefix}.context_length", raw["context_length"]),
        **{key: _optional_count(f"{prefix}.{key}", pick(key)) for key in optional_counts},
        prefix_caching=_prefix_caching(prefix, raw["prefix_caching"], policy),
        async_scheduling=_async_scheduling(prefix, raw["async_scheduling"], policy),
        rank_policy=_choice(f"{prefix}.rank_policy", raw["rank_policy"], RANK_POLICIES),
        kv_offload=_kv_offload(prefix, raw, block_size, policy),
        reserve_full_isl=_reserve_full_isl(prefix, raw["reserve_full_isl"], policy),
        cache_generated_blocks=_cache_generated_blocks(prefix, raw, policy),
        schedule_conservativeness=None
        if conservativeness is None
        else _number(f"{prefix}.schedule_conservativeness", conservativeness),  # SGLang asserts >= 0
    )


def _auto_num_blocks(
    prefix: str, raw: Mapping[str, Any], defaults: Mapping[str, Any], timing: TimingConfig, block_size: int
) -> int:
    """``num_blocks: auto``: the KV blocks aiconfigurator-core's memory model gives one rank."""
    def pick(key: str) -> Any:
        return defaults[key] if raw[key] is None else raw[key]

    max_sequences = _count(f"{prefix}.max_sequences", pick("max_sequences"))
    budgets = [
        _optional_count(f"{prefix}.{key}", pick(key))
        for key in ("max_batched_tokens", "chunked_prefill_size", "max_prefill_tokens")
    ]
    max_tokens = max([b for b in budgets if b is not None], default=max_sequences)
    return aic.auto_num_blocks(timing, block_size, max_tokens, max_sequences, field=f"{prefix}.num_blocks")


def _timing(raw: Mapping[str, Any], policy: str) -> TimingConfig:
    kind = _choice("timing.type", raw["type"], TIMING_TYPES)
    extra: dict[str, Any] = {}
    if kind == "aic":
        for key, example in (("model", "meta-llama/Meta-Llama-3.1-8B"), ("gpu", "h200_sxm")):
            if raw[key] is None:
                raise ConfigError(
                    f"timing.{key} must be set for timing.type=aic (e.g. timing.{key}={example}; "
                    "see docs/timing.md)"
                )
        version = raw["backend_version"]
        if version is not None and not isinstance(version, str):
            if not _is_number(version):
                raise ConfigError(f"timing.backend_version must be a version string, got {version!r}")
            version = str(version)
        fraction = raw["memory_fraction"]
        fraction = AIC_MEMORY_FRACTION if fraction is None else _number("timing.memory_fraction", fraction, strict=True)
        if fraction > 1:
            raise ConfigError(f"timing.memory_fraction must be in (0, 1], got {raw['memory_fraction']!r}")
        extra = dict(
            model=_optional_str("timing.model", raw["model"]),
            gpu=_optional_str("timing.gpu", raw["gpu"]),
            backend=_choice("timing.backend", policy if raw["backend"] is None else raw["backend"], POLICIES),
            backend_version=_optional_str("timing.backend_version", version),
            memory_fraction=fraction,
        )
    if kind == "table":
        if raw["profile"] is None:
            raise ConfigError(
                "timing.profile must be set for timing.type=table (a directory holding dense.csv, "
                "attention.csv and per_sequence.csv; see docs/timing.md)"
            )
        profile = _optional_str("timing.profile", raw["profile"])
        if not os.path.isdir(profile):
            raise ConfigError(f"timing.profile must be an existing directory, got {profile!r}")
        num_layers = _optional_count("timing.num_layers", raw["num_layers"])
        if num_layers is None:
            num_layers = read_num_layers(profile)
        if num_layers is None:
            raise ConfigError(
                f"timing.num_layers must be set: {profile} has no meta.yaml with a top-level "
                "num_layers (profiles are per layer; meta.yaml's hf_overrides.num_hidden_layers is "
                "the profiled count, not the model's)"
            )
        extra = dict(profile=profile, num_layers=num_layers)
    extra.update(_pass_terms(raw, kind, extra, policy))
    return TimingConfig(
        type=kind,
        **{
            key: _number(f"timing.{key}", raw[key])
            for key in (
                "prefill_ms",
                "decode_ms",
                "base_ms",
                "per_prefill_token_us",
                "per_decode_seq_us",
                "per_kv_token_ns",
            )
        },
        **extra,
    )


def _pass_terms(raw: Mapping[str, Any], kind: str, extra: Mapping[str, Any], policy: str) -> dict[str, Any]:
    """timing.tp, scales, overhead, CUDA-graph sizes, the model dimensions and timing.allreduce.*
    (docs/timing.md)."""
    for key in ("tp", "num_layers", "hidden_size"):
        _optional_count(f"timing.{key}", raw[key])  # the type first, whichever rule reads it
        if raw[key] is not None and kind not in ALLREDUCE_TYPES:
            raise ConfigError(
                f"timing.{key} is only used by timing.type=linear, table or aic, got {raw[key]!r} "
                f"with timing.type={kind}"
            )
    ar = raw["allreduce"]
    latency = _optional_number("timing.allreduce.latency_us", ar["latency_us"])
    bandwidth = _optional_number(
        "timing.allreduce.bandwidth_gb_per_second", ar["bandwidth_gb_per_second"], strict=True
    )
    curve = _optional_str("timing.allreduce.curve", ar["curve"])
    out: dict[str, Any] = dict(
        tp=1 if raw["tp"] is None else _count("timing.tp", raw["tp"]),
        dtype_bytes=_count("timing.dtype_bytes", raw["dtype_bytes"]),
        prefill_scale=_number("timing.prefill_scale", raw["prefill_scale"], strict=True),
        decode_scale=_number("timing.decode_scale", raw["decode_scale"], strict=True),
        pass_overhead_us=_number("timing.pass_overhead_us", raw["pass_overhead_us"]),
        attention_skew_alpha=_number("timing.attention_skew_alpha", raw["attention_skew_alpha"]),
    )
    if out["attention_skew_alpha"] != 0.0 and kind not in ("linear", "table"):
        raise ConfigError(
            f"timing.attention_skew_alpha is only used by timing.type=linear or table, got "
            f"{_shown(raw['attention_skew_alpha'])} with timing.type={kind}"
        )
    out["cuda_graph_sizes"] = _graph_sizes(raw["cuda_graph_sizes"], policy)
    for key in ("prefill_scale", "decode_scale", "pass_overhead_us", "cuda_graph_sizes"):
        if raw[key] != DEFAULTS["timing"][key] and kind == "fixed":
            raise ConfigError(f"timing.{key} is only used by timing.type=linear, table or aic, got {raw[key]!r}")
    if bandwidth is None and curve is None:
        if latency is not None:
            raise ConfigError(
                "timing.allreduce.latency_us needs timing.allreduce.bandwidth_gb_per_second (ring model)"
            )
        if kind == "linear" and raw["num_layers"] is not None:
            raise ConfigError("timing.num_layers is only used by timing.type=linear with timing.allreduce set")
        if raw["hidden_size"] is not None:
            raise ConfigError(
                f"timing.hidden_size is only used with timing.allreduce set (the TP all-reduce's message size), "
                f"got {_shown(raw['hidden_size'])}"
            )
        return out
    if curve is not None and (bandwidth is not None or latency is not None):
        raise ConfigError(
            "timing.allreduce.curve replaces the ring model: set it or "
            "timing.allreduce.{latency_us,bandwidth_gb_per_second}, not both"
        )
    if kind not in ALLREDUCE_TYPES:
        raise ConfigError(f"timing.allreduce is only used by timing.type=linear, table or aic, got {kind}")
    if out["tp"] < 2:
        raise ConfigError("timing.allreduce needs timing.tp >= 2 (one GPU does no all-reduce), got timing.tp=1")
    if curve is not None and not os.path.isfile(curve):
        raise ConfigError(f"timing.allreduce.curve must be an existing CSV file, got {curve!r}")
    num_layers = extra.get("num_layers") or _optional_count("timing.num_layers", raw["num_layers"])
    hidden = _optional_count("timing.hidden_size", raw["hidden_size"])
    if kind == "table" and hidden is None:
        from simcore.timing.profile import read_meta_count  # lazy: it imports this module

        hidden = read_meta_count(extra["profile"], "hidden_size")
    if kind == "aic" and (hidden is None or num_layers is None):
        from simcore.timing import aic  # lazy: the optional extra

        layers_cfg, hidden_cfg = aic.model_dimensions(raw["model"])
        num_layers = num_layers or layers_cfg
        hidden = hidden or hidden_cfg
    for key, value in (("num_layers", num_layers), ("hidden_size", hidden)):
        if value is None:
            raise ConfigError(f"timing.{key} must be set for timing.allreduce with timing.type={kind}")
    out.update(
        num_layers=num_layers,
        hidden_size=hidden,
        allreduce_latency_us=0.0 if latency is None and curve is None else latency,
        allreduce_bandwidth_gb_per_second=bandwidth,
        allreduce_curve=curve,
    )
    return out


def _graph_sizes(value: Any, policy: str) -> tuple[int, ...] | str | None:
    """timing.cuda_graph_sizes: None, VLLM_DEFAULT_GRAPHS (resolved from the pools) or sorted unique sizes."""
    if value is None:
        return None
    if value == VLLM_DEFAULT_GRAPHS:
        if policy != "vllm":
            raise ConfigError(
                f"timing.cuda_graph_sizes={VLLM_DEFAULT_GRAPHS} is vLLM's rule (engine.policy=vllm); "
                f"give a list of sizes with engine.policy={policy}"
            )
        return VLLM_DEFAULT_GRAPHS
    if isinstance(value, (str, bytes, Mapping)) or not hasattr(value, "__iter__") or len(value) == 0:
        raise ConfigError(
            f"timing.cuda_graph_sizes must be null, {VLLM_DEFAULT_GRAPHS} or a non-empty list of token "
            f"counts, got {_shown(value)}"
        )
    # vLLM de-duplicates and sorts the capture sizes it is given (VllmConfig._set_cudagraph_sizes)
    return tuple(sorted({_count("timing.cuda_graph_sizes", size) for size in value}))


def vllm_graph_sizes(pools: list[PoolConfig]) -> tuple[int, ...]:
    """vLLM's default CUDA-graph capture sizes for the active pools (docs/timing.md).

    vLLM 0.12+ (``VllmConfig._set_cudagraph_sizes``, no speculative decoding):
    the largest size is ``min(2 x max_num_seqs, 512, max_num_batched_tokens)``;
    the sizes are 1, 2, 4, then every multiple of 8 below 256, then every
    multiple of 16 from 256, up to the largest.

    Parameters
    ----------
    pools : list of PoolConfig
        The active engine pools (vllm policy: ``max_batched_tokens`` set).

    Returns
    -------
    tuple of int
        Ascending capture sizes.

    Raises
    ------
    ConfigError
        The pools give different sizes.
    """
    found = set()
    for pool in pools:
        largest = min(2 * pool.max_sequences, 512, pool.max_batched_tokens)
        sizes = [s for s in (1, 2, 4) if s <= largest]
        sizes += list(range(8, min(largest + 1, 256), 8)) + list(range(256, largest + 1, 16))
        found.add(tuple(sizes))
    if len(found) > 1:
        raise ConfigError(
            f"timing.cuda_graph_sizes={VLLM_DEFAULT_GRAPHS} differs between the engine pools "
            "(max_sequences, max_batched_tokens); give the sizes as a list"
        )
    return found.pop()


def _next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def _aic_limits(pools: list[PoolConfig]) -> dict[str, int]:
    """The largest pass of the active pools, rounded up to powers of two (table ranges)."""
    tokens = max(
        max(p.max_batched_tokens or 0, p.chunked_prefill_size or 0, p.max_prefill_tokens or 0) + p.max_sequences
        for p in pools
    )
    return dict(
        pass_tokens_limit=_next_pow2(tokens),
        pass_sequences_limit=_next_pow2(max(p.max_sequences for p in pools)),
        context_limit=_next_pow2(max(p.sequence_limit for p in pools)),
    )


def _vllm_pool_flag(prefix: str, key: str, value: Any, policy: str, refused_pool: str, why: str) -> bool:
    """A pool flag modelled for the vllm policy only and refused on one pool (``why`` says why)."""
    enabled = _flag(f"{prefix}.{key}", value)
    if enabled and policy != "vllm":
        raise ConfigError(f"{prefix}.{key} is modelled for engine.policy=vllm only, got {policy}")
    if enabled and prefix.endswith(f".{refused_pool}"):
        raise ConfigError(f"{prefix}.{key}: {why}")
    return enabled


def _async_scheduling(prefix: str, value: Any, policy: str) -> bool:
    return _vllm_pool_flag(
        prefix, "async_scheduling", value, policy, "prefill",
        "not modelled for a P/D prefill pool (its prompts hand off instead of sampling); "
        "set it on engine.decode or engine.aggregated",
    )


def _reserve_full_isl(prefix: str, value: Any, policy: str) -> bool:
    enabled = _flag(f"{prefix}.reserve_full_isl", value)
    if enabled and policy != "vllm":
        raise ConfigError(f"{prefix}.reserve_full_isl is modelled for engine.policy=vllm only, got {policy}")
    return enabled


def _prefix_caching(prefix: str, value: Any, policy: str) -> bool:
    """Every policy caches prefixes (docs/prefix-caching.md), on any pool but a P/D decode pool."""
    enabled = _flag(f"{prefix}.prefix_caching", value)
    if enabled and prefix.endswith(".decode"):
        raise ConfigError(f"{prefix}.prefix_caching: a decode pool receives its KV by transfer; enable it on engine.prefill")
    return enabled


def _cache_generated_blocks(prefix: str, raw: Mapping[str, Any], policy: str) -> bool:
    """vLLM's prefix cache also keeps the full blocks of generated tokens (docs/prefix-caching.md):
    vllm policy (SGLang's radix cache holds them already), with prefix caching, without a CPU tier."""
    key = f"{prefix}.cache_generated_blocks"
    enabled = _flag(key, raw["cache_generated_blocks"])
    if not enabled:
        return False
    if policy != "vllm":
        raise ConfigError(f"{key} is modelled for engine.policy=vllm only, got {policy}")
    if not raw["prefix_caching"]:
        raise ConfigError(f"{key} needs {prefix}.prefix_caching=true")
    if any(value is not None for value in raw["kv_offload"].values()):
        raise ConfigError(f"{key} is not modelled with {prefix}.kv_offload (its CPU tier stores prompt blocks only)")
    return True


def _router(raw: Mapping[str, Any], decode_raw: Mapping[str, Any]) -> RouterConfig:
    weights = raw["weights"]
    return RouterConfig(
        policy=_choice("engine.router.policy", raw["policy"], ROUTER_POLICIES),
        decode_policy=_choice("engine.decode_router.policy", decode_raw["policy"], DECODE_ROUTER_POLICIES),
        weights=tuple(_number(f"engine.router.weights.{key}", weights[key]) for key in ROUTER_WEIGHTS),
    )


@dataclass(frozen=True)
class KVOffloadConfig:
    """A rank's CPU tier of KV blocks (vLLM's OffloadingConnector, docs/prefix-caching.md)."""

    num_blocks: int  # CPU blocks per rank, at the pool's block_size
    bandwidth_gb_per_second: float  # each direction, GB/s
    bytes_per_token: float  # KV bytes per token

    def block_ns(self, block_size: int) -> int:
        """One block's copy, ns: rint(block_size x bytes_per_token / (bandwidth x 1e9) x 1e9)."""
        return int(np.rint(block_size * self.bytes_per_token / (self.bandwidth_gb_per_second * 1e9) * 1e9))


def _kv_offload(prefix: str, raw: Mapping[str, Any], block_size: int, policy: str) -> KVOffloadConfig | None:
    """All three keys set (a CPU tier) or all null (none); only beside prefix caching."""
    path = f"{prefix}.kv_offload"
    keys = raw["kv_offload"]
    if all(value is None for value in keys.values()):
        return None
    for key, value in keys.items():
        if value is None:
            raise ConfigError(f"{path}.{key} must be set with the other {path} keys (all null: no CPU tier)")
    if policy != "vllm":
        raise ConfigError(f"{path} is modelled for engine.policy=vllm only (vLLM's OffloadingConnector), got {policy}")
    if not raw["prefix_caching"]:
        raise ConfigError(f"{path} needs {prefix}.prefix_caching=true (the CPU tier holds prefix-cache blocks)")
    if raw["async_scheduling"]:
        raise ConfigError(f"{path} is not modelled with {prefix}.async_scheduling=true")
    if raw["reserve_full_isl"]:
        raise ConfigError(f"{path} is not modelled with {prefix}.reserve_full_isl=true")
    offload = KVOffloadConfig(
        num_blocks=_count(f"{path}.num_blocks", keys["num_blocks"]),
        bandwidth_gb_per_second=_number(f"{path}.bandwidth_gb_per_second", keys["bandwidth_gb_per_second"], strict=True),
        bytes_per_token=_number(f"{path}.bytes_per_token", keys["bytes_per_token"], strict=True),
    )
    if not block_size * offload.bytes_per_token / (offload.bandwidth_gb_per_second * 1e9) * 1e3 < MAX_INSTANT_MS:
        raise ConfigError(f"{path}.bytes_per_token={offload.bytes_per_token!r} at bandwidth_gb_per_second="
                          f"{offload.bandwidth_gb_per_second!r}: one block's copy exceeds {MAX_INSTANT_MS:.4g} ms")
    return offload


def _check_combinations(cfg: SimConfig) -> None:
    _check_key_scopes(cfg)
    if cfg.engine.router.policy == "prefix_aware" and not cfg.engine.pools[0].prefix_caching:
        receiving = POOLS[cfg.engine.mode][0]
        raise ConfigError(
            f"engine.router.policy=prefix_aware reads the prefix cache: it needs "
            f"engine.{receiving}.prefix_caching=true"
        )
    w, ld = cfg.workload, cfg.load
    if cfg.output.mode == "bounded" and cfg.output.tokens:
        raise ConfigError(
            "output.tokens=true needs output.mode=detailed: the bounded mode keeps no per-token instants"
        )
    transfer = cfg.engine.kv_transfer
    if (transfer.bandwidth_gb_per_second is None) != (transfer.bytes_per_token is None):
        raise ConfigError(
            "engine.kv_transfer.bandwidth_gb_per_second and engine.kv_transfer.bytes_per_token "
            "must be set together (both null: transfers take no time)"
        )
    if w.source in FILE_SOURCES and w.path is None:
        raise ConfigError(f"workload.path must be set when workload.source={w.source}")
    if w.source in GENERATED_SOURCES and w.num_requests is None:
        raise ConfigError(f"workload.num_requests must be set for workload.source={w.source}")
    for column in ("input", "output"):
        dist = getattr(w, f"{column}_dist")
        std = getattr(w, f"{column}_std")
        if dist in ("normal", "lognormal") and std == 0:
            raise ConfigError(
                f"workload.{column}_std must be > 0 for workload.{column}_dist={dist}, got 0"
            )
        if dist == "uniform":
            low = math.floor(getattr(w, f"{column}_tokens") * w.range_ratio)
            if low < 1:
                raise ConfigError(
                    f"workload.range_ratio={w.range_ratio!r} gives a lower bound of {low} "
                    f"for workload.{column}_tokens; it must give at least 1"
                )
    if ld.type in OPEN_LOOP_GENERATED and ld.request_rate is None:
        raise ConfigError(f"load.request_rate must be set (> 0) for load.type={ld.type}")
    bounds.check_run(cfg, bounds.configured_size(cfg))


@dataclass(frozen=True)
class KeyScope:
    """Keys that take effect only where ``applies``; set elsewhere, they are an error.

    ``needs`` says where they apply (``{pool}``: the receiving pool) and
    ``given`` what the configuration has instead, for the message
    ``<key> <phrase> <needs>, got <value> with <given>``.
    """

    section: str
    keys: tuple[str, ...]
    applies: Callable[[SimConfig], bool]
    needs: str
    given: Callable[[SimConfig], str]
    phrase: str = "is only used by"


_NO_EFFECT = "has no effect here: it is only used with"


def _setting(section: str, key: str) -> Callable[[SimConfig], str]:
    return lambda cfg: f"{section}.{key}={cfg.resolved[section][key]}"


def _section(tree: Mapping[str, Any], section: str) -> Mapping[str, Any]:
    """The mapping at a dotted section (``engine.prefill``)."""
    for part in section.split("."):
        tree = tree[part]
    return tree


def _auto_pools(cfg: SimConfig) -> list[str]:
    return [name for name in POOLS[cfg.engine.mode] if cfg.resolved["engine"][name]["num_blocks"] == AUTO_BLOCKS]


#: The engine sections each mode reads (kv_transfer: the P/D hand-off).
_SECTION_MODE = {pool: mode for mode, pools in POOLS.items() for pool in pools} | {
    "kv_transfer": "disaggregated", "decode_router": "disaggregated"
}

#: Which key applies when: every such rule, read in this order by :func:`_check_key_scopes`.
KEY_SCOPES = (
    *(
        KeyScope(f"engine.{name}", tuple(DEFAULTS["engine"][name]), lambda cfg, mode=mode: cfg.engine.mode == mode,
                 f"engine.mode={mode}", _setting("engine", "mode"))
        for name, mode in _SECTION_MODE.items()
    ),
    KeyScope("timing", AIC_KEYS, lambda cfg: cfg.timing.type == "aic", "timing.type=aic", _setting("timing", "type")),
    KeyScope("timing", TABLE_KEYS, lambda cfg: cfg.timing.type == "table", "timing.type=table",
             _setting("timing", "type")),
    KeyScope("workload", ("path",), lambda cfg: cfg.workload.source in FILE_SOURCES,
             "workload.source=table, mooncake or azure", _setting("workload", "source")),
    KeyScope("workload", ("block_size",), lambda cfg: cfg.workload.source == "mooncake", "workload.source=mooncake",
             _setting("workload", "source")),
    KeyScope("workload", tuple(k for k in TRACE_KEYS if k != "block_size"),
             lambda cfg: cfg.workload.source in TRACE_SOURCES, "workload.source=mooncake or azure",
             _setting("workload", "source")),
    *(
        KeyScope("workload", (f"{column}_std",),
                 lambda cfg, column=column: getattr(cfg.workload, f"{column}_dist") in ("normal", "lognormal"),
                 "normal/lognormal lengths", _setting("workload", f"{column}_dist"))
        for column in ("input", "output")
    ),
    KeyScope("workload", ("prefix_tokens",), lambda cfg: cfg.workload.source == "synthetic",
             "workload.source=synthetic (traces carry hash_ids)", _setting("workload", "source")),
    KeyScope("workload.shared_prefix", tuple(DEFAULTS["workload"]["shared_prefix"]),
             lambda cfg: cfg.workload.source == "shared_prefix", "workload.source=shared_prefix",
             _setting("workload", "source")),
    KeyScope("workload.sessions", tuple(k for k in DEFAULTS["workload"]["sessions"] if k != "think_time_ms"),
             lambda cfg: cfg.workload.source == "sessions", "workload.source=sessions",
             _setting("workload", "source")),
    # Also a table's (or simcore.run's requests table's) sessions: build_requests checks it has some.
    KeyScope("workload.sessions", ("think_time_ms",),
             lambda cfg: cfg.workload.source in ("sessions", "table", "synthetic"),
             "sessions (workload.source=sessions, or a table with session_id and turn columns)",
             _setting("workload", "source")),
    KeyScope("workload", ("num_requests",), lambda cfg: cfg.workload.source != "sessions",
             "sources other than sessions (workload.sessions.num_sessions sizes a sessions workload)",
             _setting("workload", "source"), _NO_EFFECT),
    KeyScope("load", ("request_rate",), lambda cfg: cfg.load.type in OPEN_LOOP_GENERATED,
             "constant_rate, poisson and gamma loads", _setting("load", "type")),
    KeyScope("load", ("burstiness",), lambda cfg: cfg.load.type == "gamma", "load.type=gamma", _setting("load", "type")),
    KeyScope("load", ("think_time_ms",), lambda cfg: cfg.load.type == "closed_loop", "load.type=closed_loop",
             _setting("load", "type")),
    KeyScope("load", ("speedup",), lambda cfg: cfg.load.type == "trace", "load.type=trace", _setting("load", "type")),
    # Keys the command line always passes: set means different from the default
    # (a default given explicitly cannot be told apart; docs/semantics.md).
    KeyScope("load", ("concurrency",), lambda cfg: cfg.load.closed_loop, "load.type=closed_loop",
             _setting("load", "type"), _NO_EFFECT),
    KeyScope("workload", SYNTHETIC_KEYS, lambda cfg: cfg.workload.source == "synthetic", "workload.source=synthetic",
             _setting("workload", "source"), _NO_EFFECT),
    KeyScope("workload", ("range_ratio",), lambda cfg: "uniform" in (cfg.workload.input_dist, cfg.workload.output_dist),
             "a uniform workload.input_dist or output_dist",
             lambda cfg: f"{cfg.workload.input_dist}/{cfg.workload.output_dist} lengths", _NO_EFFECT),
    KeyScope("timing", FIXED_KEYS, lambda cfg: cfg.timing.type == "fixed", "timing.type=fixed",
             _setting("timing", "type"), _NO_EFFECT),
    KeyScope("timing", LINEAR_KEYS, lambda cfg: cfg.timing.type == "linear", "timing.type=linear",
             _setting("timing", "type"), _NO_EFFECT),
    KeyScope("workload", ("prefix_tokens",), lambda cfg: cfg.engine.pools[0].prefix_caching,
             "engine.{pool}.prefix_caching=true", lambda cfg: "prefix caching off", _NO_EFFECT),
    KeyScope("engine.router.weights", ROUTER_WEIGHTS, lambda cfg: cfg.engine.router.policy == "prefix_aware",
             "engine.router.policy=prefix_aware", lambda cfg: f"engine.router.policy={cfg.engine.router.policy}"),
    KeyScope("timing", ("memory_fraction",), lambda cfg: bool(_auto_pools(cfg)), "engine.<pool>.num_blocks=auto",
             lambda cfg: "no pool's num_blocks=auto", _NO_EFFECT),
)


def _check_key_scopes(cfg: SimConfig) -> None:
    """A key set (different from its default) where it has no effect is an error, not silently ignored."""
    for scope in KEY_SCOPES:
        if scope.applies(cfg):
            continue
        for key in scope.keys:
            value = _section(cfg.resolved, scope.section)[key]
            if value != _section(DEFAULTS, scope.section)[key]:
                needs = scope.needs.format(pool=POOLS[cfg.engine.mode][0])  # the receiving pool
                raise ConfigError(
                    f"{scope.section}.{key} {scope.phrase} {needs}, got {_shown(value)} with {scope.given(cfg)}"
                )
