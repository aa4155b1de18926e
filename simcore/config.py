"""Run configuration: merging, each stage's parser, and the rules between stages.

The configuration is a nested mapping with the same shape as the Hydra config
(``runners/conf/``).  Each stage declares its keys once, with their defaults and
checks, in its own settings module (``simcore/{workload,client,scheduler,engine,
timing,metrics}/settings.py``; :mod:`simcore.settings` assembles them into
:class:`SimConfig`).  :func:`load_config` merges a user mapping over
:data:`DEFAULTS`, calls each stage's parser, applies the rules that relate
settings of different stages (:data:`KEY_SCOPES`, :func:`_check_combinations`)
and then :func:`simcore.derive.derive`, which computes the derived values
(model dimensions, ``num_blocks: auto``, worst-case bounds).  Errors are
:class:`ConfigError` naming the dotted field, the value and what is allowed.
This module never imports Hydra, nor the timing models.
"""

from __future__ import annotations

import copy
import math
from typing import Any, Mapping

from simcore.checks import count, optional_number, shown
from simcore.client.settings import (
    DetokenizationConfig,
    TokenizationConfig,
    parse_detokenization,
    parse_tokenization,
)
from simcore.derive import derive, vllm_graph_sizes
from simcore.engine import settings as engine_settings
from simcore.engine.settings import (
    AUTOSCALE_ROUTER_POLICIES,
    DECODE_ROUTER_POLICIES,
    ENGINE_MODES,
    POOLS,
    ROUTER_WEIGHTS,
    EngineConfig,
    KVTransferConfig,
    RouterConfig,
)
from simcore.errors import ConfigError, InstantOverflow
from simcore.metrics import settings as metrics_settings
from simcore.metrics.settings import OUTPUT_MODES, GoodputConfig, MetricsConfig, OutputConfig
from simcore.scheduler.settings import (
    AUTO_BLOCKS,
    DEFAULT_KV_TOKENS,
    POLICY_DEFAULTS,
    KVOffloadConfig,
    PoolConfig,
)
from simcore.scheduler.policies import POLICIES
from simcore.scopes import KEY_SCOPES, KeyScope, check_key_scopes, check_pool_timing_scopes
from simcore.settings import DEFAULTS, SimConfig
from simcore.timing import settings as timing_settings
from simcore.timing.settings import (
    AIC_KEYS,
    AIC_MEMORY_FRACTION,
    ALLREDUCE_TYPES,
    FIXED_KEYS,
    LINEAR_KEYS,
    TABLE_KEYS,
    TIMING_TYPES,
    VLLM_DEFAULT_GRAPHS,
    TimingConfig,
)
from simcore.units import MAX_INSTANT_MS
from simcore.workload import settings as workload_settings
from simcore.workload.settings import (
    FILE_SOURCES,
    GENERATED_SOURCES,
    LENGTH_DISTS,
    LOAD_TYPES,
    MOONCAKE_BLOCK_SIZE,
    OPEN_LOOP_GENERATED,
    SESSION_TURNS_DISTS,
    SYNTHETIC_KEYS,
    TRACE_KEYS,
    TRACE_SOURCES,
    WORKLOAD_SOURCES,
    LoadConfig,
    SessionsConfig,
    SharedPrefixConfig,
    WorkloadConfig,
)

# The names this module has always offered: every settings class and constant
# stays importable from simcore.config (their homes are the stage modules).
__all__ = [
    "AIC_KEYS", "AIC_MEMORY_FRACTION", "ALLREDUCE_TYPES", "AUTO_BLOCKS", "DECODE_ROUTER_POLICIES",
    "DEFAULTS", "DEFAULT_KV_TOKENS", "ENGINE_MODES", "FILE_SOURCES", "FIXED_KEYS", "GENERATED_SOURCES",
    "KEY_SCOPES", "LENGTH_DISTS", "LINEAR_KEYS", "LOAD_TYPES", "MOONCAKE_BLOCK_SIZE", "OPEN_LOOP_GENERATED",
    "OUTPUT_MODES", "POLICIES", "POLICY_DEFAULTS", "POOLS", "ROUTER_WEIGHTS", "SESSION_TURNS_DISTS",
    "SYNTHETIC_KEYS", "TABLE_KEYS", "TIMING_TYPES", "TRACE_KEYS", "TRACE_SOURCES", "VLLM_DEFAULT_GRAPHS",
    "WORKLOAD_SOURCES", "ConfigError", "DetokenizationConfig", "EngineConfig", "GoodputConfig",
    "InstantOverflow", "KVOffloadConfig", "KVTransferConfig", "KeyScope", "LoadConfig", "MetricsConfig",
    "OutputConfig", "PoolConfig", "RouterConfig", "SessionsConfig", "SharedPrefixConfig", "SimConfig",
    "TimingConfig", "TokenizationConfig", "WorkloadConfig", "dotted_keys", "load_config", "merge_config",
    "vllm_graph_sizes",
]



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
        path = f"{prefix}{name if isinstance(name, str) and name.isprintable() else repr(name)}"  # one line
        if name not in base:
            allowed = ", ".join(sorted(base))
            raise ConfigError(f"{path} is not a known key (allowed here: {allowed})")
        if isinstance(base[name], dict):
            if not isinstance(value, Mapping):
                raise ConfigError(f"{path} must be a mapping, got {value!r}")
            _merge_into(base[name], value, path + ".")
        else:
            try:
                base[name] = _copied_tree(value)
            except Exception:  # noqa: BLE001 - a generator, a lock, an open file: not a config value
                raise ConfigError(f"{path} must be a number, string, list or mapping, "
                                  f"got a {type(value).__qualname__}") from None


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
    seed = count("seed", raw["seed"], minimum=0)
    workload = workload_settings.parse(raw["workload"], "workload")
    load = workload_settings.parse_load(raw["load"], "load")
    # The timing settings read engine.policy, and the pools read timing.type.
    policy = engine_settings.parse_policy(raw["engine"], "engine")
    timing = timing_settings.parse(raw["timing"], "timing", policy)
    own = _pool_timings(raw, policy)
    engine = engine_settings.parse(
        raw["engine"], "engine", {name: own[name].type if name in own else timing.type for name in POOL_NAMES}
    )
    cfg = SimConfig(
        seed=seed,
        workload=workload,
        load=load,
        engine=engine,
        timing=timing,
        pool_timing=tuple(own.get(name, timing) for name in POOLS[engine.mode]),
        tokenization=parse_tokenization(raw["tokenization"], "tokenization"),
        detokenization=parse_detokenization(raw["detokenization"], "detokenization"),
        max_time_ms=optional_number("max_time_ms", raw["max_time_ms"], maximum=MAX_INSTANT_MS),
        metrics=metrics_settings.parse(raw["metrics"], "metrics"),
        output=metrics_settings.parse_output(raw["output"], "output"),
        resolved=raw,
    )
    _check_combinations(cfg)
    return derive(cfg)


#: Every pool section of engine (active or not).
POOL_NAMES = ("aggregated", "prefill", "decode")


def _pool_timings(raw: Mapping[str, Any], policy: str) -> dict[str, TimingConfig]:
    """Each active pool's own timing: its ``engine.<pool>.timing`` keys merged over the timing section
    and checked by the timing stage's parser (messages name ``engine.<pool>.timing.<key>``)."""
    own = {}
    for name in POOLS[raw["engine"]["mode"]]:
        override = raw["engine"][name]["timing"]
        if override is None:
            continue
        path = f"engine.{name}.timing"
        if not isinstance(override, Mapping):
            raise ConfigError(f"{path} must be a mapping of timing keys (e.g. {{gpu: H200}}) or null, "
                              f"got {shown(override)}")
        merged = _copied_tree(raw["timing"])
        _merge_into(merged, override, path + ".")
        own[name] = timing_settings.parse(merged, path, policy)
    return own


def _check_combinations(cfg: SimConfig) -> None:
    """The rules that relate keys of several sections (read after every section is checked)."""
    check_key_scopes(cfg)
    check_pool_timing_scopes(cfg)
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
    if cfg.output.mode == "bounded" and cfg.output.trace and cfg.detokenization.enabled:
        raise ConfigError(
            "output.trace=true needs output.mode=detailed when the detokenizer is on: its jobs are read "
            "from per-token instants, which the bounded mode does not keep"
        )
    transfer = cfg.engine.kv_transfer
    # with a roofline pool and no bytes_per_token, the model's KV bytes (simcore.derive)
    from_model = transfer.bandwidth_gb_per_second is not None and any(
        cfg.timing_of(i).type == "roofline" for i in range(len(cfg.engine.pools)))
    if (transfer.bandwidth_gb_per_second is None) != (transfer.bytes_per_token is None) and not from_model:
        raise ConfigError(
            "engine.kv_transfer.bandwidth_gb_per_second and engine.kv_transfer.bytes_per_token "
            "must be set together (both null: transfers take no time; bytes_per_token null takes the model's "
            "KV bytes with timing.type=roofline)"
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
    _check_expert_parallel(cfg)
    _check_autoscale(cfg)
    _check_failures(cfg)


def _check_failures(cfg: SimConfig) -> None:
    """Failures (docs/failures.md): their required key, the workers named, what they are not modelled with."""
    fail = cfg.engine.failures
    if not fail.enabled:
        return
    if fail.repair_ms is None:
        raise ConfigError("engine.failures.repair_ms must be set when failures are configured "
                          "(engine.failures.at or engine.failures.mtbf_ms)")
    replicas = cfg.engine.aggregated.replicas
    for i, (worker, _) in enumerate(fail.at):
        if worker >= replicas:
            raise ConfigError(f"engine.failures.at[{i}].worker must be < engine.aggregated.replicas={replicas}, "
                              f"got {worker}")
    given = "engine.failures.at or engine.failures.mtbf_ms"
    if cfg.engine.autoscale.metric != "none":
        raise ConfigError(f"{given} is not modelled with engine.autoscale.metric={cfg.engine.autoscale.metric}")
    if cfg.engine.aggregated.prefix_caching:
        raise ConfigError(f"engine.aggregated.prefix_caching=true is not modelled with {given}")
    if cfg.engine.router.policy not in AUTOSCALE_ROUTER_POLICIES:
        raise ConfigError(f"engine.router.policy={cfg.engine.router.policy} draws over the whole pool before the run; "
                          f"with {given} it must be one of {', '.join(AUTOSCALE_ROUTER_POLICIES)}")
    if cfg.output.mode == "bounded":
        raise ConfigError(f"output.mode=bounded is not modelled with {given}: a lost request's receipts "
                          "are folded into its statistics as they come")


def _check_autoscale(cfg: SimConfig) -> None:
    """Autoscaling (docs/autoscaling.md), per pool: its required keys, its bounds and the routers that can skip
    a replica."""
    receiving = POOLS[cfg.engine.mode][0]
    scaled = [("autoscale", receiving, "router")]
    if cfg.engine.mode == "disaggregated":
        scaled.append(("decode_autoscale", "decode", "decode_router"))
    for section, pool_name, router in scaled:
        scale = getattr(cfg.engine, section)
        if scale.metric == "none":
            continue
        given = f"engine.{section}.metric={scale.metric}"
        for name in ("target", "startup_ms"):
            if getattr(scale, name) is None:
                raise ConfigError(f"engine.{section}.{name} must be set when {given}")
        if scale.metric == "kv_usage" and scale.target > 1.0:
            raise ConfigError(f"engine.{section}.target must be <= 1 with {given} "
                              f"(a fraction of the KV blocks), got {scale.target!r}")
        pool = getattr(cfg.engine, pool_name)
        if scale.min_replicas > pool.replicas:
            raise ConfigError(f"engine.{section}.min_replicas must be <= engine.{pool_name}.replicas={pool.replicas} "
                              f"(the most replicas), got {scale.min_replicas}")
        if pool.prefix_caching:
            raise ConfigError(f"engine.{pool_name}.prefix_caching=true is not modelled with {given}: "
                              "a replica that restarts would keep its cache")
        policy = cfg.engine.router.policy if router == "router" else cfg.engine.router.decode_policy
        if policy not in AUTOSCALE_ROUTER_POLICIES:
            raise ConfigError(f"engine.{router}.policy={policy} draws over the whole pool before the run; "
                              f"with {given} it must be one of {', '.join(AUTOSCALE_ROUTER_POLICIES)}")
        if scale.metric == "itl" and cfg.output.mode == "bounded":
            raise ConfigError(f"output.mode=bounded is not modelled with {given}: an inter-token gap reads the "
                              "previous token's emission, which the bounded mode does not keep")


def _check_expert_parallel(cfg: SimConfig) -> None:
    """MoE timing and expert parallelism (docs/timing.md, docs/semantics.md): moe.csv is one GPU
    holding every expert, so several GPUs need the experts split (expert_parallel); the
    all-to-all is expert parallelism's."""
    names = POOLS[cfg.engine.mode]
    for index, (name, pool) in enumerate(zip(names, cfg.engine.pools)):
        timing = cfg.timing_of(index)
        t = timing.path
        if timing.type == "table" and timing.moe and (pool.attention_dp > 1 or timing.tp > 1) and not pool.expert_parallel:
            raise ConfigError(
                f"engine.{name}.expert_parallel must be true for an MoE model ({t}.moe) over "
                f"{pool.attention_dp} attention-DP rank(s) x {t}.tp={timing.tp}: moe.csv times one GPU "
                "holding every expert; experts split by tensor parallelism are not modelled"
            )
        if pool.expert_parallel and pool.speculative is not None:
            raise ConfigError(
                f"engine.{name}.expert_parallel is not modelled with engine.{name}.speculative (the ranks' "
                "lock-step prices no proposals)"
            )
    for index, timing in enumerate(cfg.pool_timing or (cfg.timing,)):
        if timing.alltoall and not any(
            pool.expert_parallel for i, pool in enumerate(cfg.engine.pools) if cfg.timing_of(i) is timing
        ):
            raise ConfigError(
                f"{timing.path}.moe.alltoall has no effect here: it is only used with engine.<pool>.expert_parallel=true"
            )
