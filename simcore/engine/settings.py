"""The engine's settings: its mode, policy, pools, KV hand-off and routers.

Each key is declared once, as a field of a frozen dataclass
(:func:`simcore.checks.key`); the pools' keys and the policy defaults are in
:mod:`simcore.scheduler.settings`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from simcore import checks
from simcore.checks import Later, choice, key, number, optional_number, parse_keys, section
from simcore.errors import ConfigError
from simcore.enums import ROUTER_POLICIES
from simcore.scheduler.policies import POLICIES
from simcore.scheduler.settings import PoolConfig, parse_pool

ENGINE_MODES = ("aggregated", "disaggregated")
POOLS = {"aggregated": ("aggregated",), "disaggregated": ("prefill", "decode")}
#: The decode pool has no prefix cache: load-based and oblivious choices only.
DECODE_ROUTER_POLICIES = tuple(p for p in ROUTER_POLICIES if p != "prefix_aware")
ROUTER_WEIGHTS = ("prefix", "queue", "kv_cache")
#: Autoscaling metrics (docs/autoscaling.md): ``none`` (a fixed pool), the
#: requests outstanding per replica, the KV-cache usage per replica; the mean
#: TTFT or ITL of the tokens emitted over the last interval (an SLO target, ms).
AUTOSCALE_METRICS = ("none", "outstanding", "kv_usage", "ttft", "itl")
#: The metrics that read latencies against a target in ms.
LATENCY_METRICS = ("ttft", "itl")
#: Router policies that can skip replicas that are not ready (the seeded ones
#: draw over the whole pool before the run).
AUTOSCALE_ROUTER_POLICIES = ("round_robin", "least_outstanding", "least_tokens")
#: Longest decision interval and scale-up delay, ms (a week: bounds the ns arithmetic).
MAX_SCALE_MS = 7 * 24 * 3600 * 1000.0


@dataclass(frozen=True)
class KVTransferConfig:
    bandwidth_gb_per_second: float | None = key(
        None, optional_number, strict=True,
        doc="P/D: link bandwidth for the prompt's KV from prefill to decode; null: transfers take no time.",
    )
    bytes_per_token: float | None = key(
        None, optional_number,
        doc="P/D: KV bytes moved per prompt token; null with the bandwidth set and a roofline pool: the model's KV "
            "bytes per token over all layers, one copy (docs/semantics.md, Per-pool timing).",
    )

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


def _weights(path: str, value: Mapping[str, Any]) -> tuple[float, ...]:
    return tuple(number(f"{path}.{name}", value[name]) for name in ROUTER_WEIGHTS)


@dataclass(frozen=True)
class RouterConfig:
    """Routing over workers (docs/routing.md): names in ``simcore.enums.ROUTER_POLICIES``.

    Its keys sit in two engine sections: ``engine.router`` routes to the
    receiving pool (aggregated or P/D prefill), ``engine.decode_router`` to the
    P/D decode pool; the weights are prefix_aware's scorers (llm-d's no-config
    default: prefix 3, queue 2, kv-cache 2).
    """

    policy: str = key(
        "round_robin", choice, at=("router", "policy"), allowed=ROUTER_POLICIES,
        doc="How requests are routed to the workers of the receiving pool (aggregated, or P/D prefill).",
    )
    decode_policy: str = key(
        "round_robin", choice, at=("decode_router", "policy"), allowed=DECODE_ROUTER_POLICIES,
        doc="P/D: how requests are routed to the decode workers.",
    )
    weights: tuple[float, float, float] = key(
        {"prefix": 3.0, "queue": 2.0, "kv_cache": 2.0}, _weights, at=("router", "weights"),
        doc="prefix_aware: weights of the prefix, queue and KV-cache scorers (llm-d's defaults 3, 2, 2).",
        values="numbers >= 0: prefix, queue, kv_cache",
    )


@dataclass(frozen=True)
class AutoscaleConfig:
    """Autoscaling of one pool (docs/autoscaling.md): the pool's ``replicas`` is the maximum.

    ``engine.autoscale`` scales the receiving pool (aggregated, or P/D prefill),
    ``engine.decode_autoscale`` the P/D decode pool, each on its own metric.
    """

    metric: str = key(
        "none", choice, allowed=AUTOSCALE_METRICS,
        doc="none: a fixed pool; outstanding or kv_usage: every interval_ms the desired replicas are "
            "ceil(sum over the ready and draining replicas of the metric / target); ttft or itl: "
            "ceil(ready and draining replicas x mean TTFT or ITL of the tokens emitted over the last interval / "
            "target); clamped to [min_replicas, replicas] (docs/autoscaling.md).",
    )
    target: float | None = key(
        None, optional_number, strict=True, maximum=1e9,
        doc="The metric's target per replica (requests outstanding, or KV blocks in use / KV blocks), "
            "or the latency target in ms (ttft, itl); required with a metric.",
    )
    interval_ms: float = key(
        15000.0, number, strict=True, maximum=MAX_SCALE_MS,
        doc="Time between two scaling decisions (Kubernetes HPA's default sync period, 15 s).",
    )
    min_replicas: int = key(1, checks.count, doc="Fewest active (ready or starting) replicas; the run starts with this many ready.")
    startup_ms: float | None = key(
        None, optional_number, maximum=MAX_SCALE_MS,
        doc="Scale-up delay: model load and warm-up, from the decision to the replica taking requests "
            "(a declared parameter); required with a metric.",
    )


FAILURE_ACTIONS = ("retry", "reject")
#: At most this many fixed failures (each an event of the run).
MAX_FIXED_FAILURES = 10_000


def _failure_list(path: str, value: Any) -> tuple[tuple[int, float], ...]:
    """``[[worker, at_ms], ...]``: each a worker index >= 0 and an instant in ms >= 0."""
    if not isinstance(value, (list, tuple)) or len(value) > MAX_FIXED_FAILURES:
        raise ConfigError(f"{path} must be a list of at most {MAX_FIXED_FAILURES} [worker, at_ms] pairs, "
                          f"got {checks.shown(value)}")
    out = []
    for i, pair in enumerate(value):
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise ConfigError(f"{path}[{i}] must be a [worker, at_ms] pair, got {checks.shown(pair)}")
        out.append((checks.count(f"{path}[{i}].worker", pair[0], minimum=0),
                    number(f"{path}[{i}].at_ms", pair[1], maximum=MAX_SCALE_MS * 52)))
    return tuple(out)


MAX_RETRIES = 1000


def _retries(path: str, value: Any) -> int:
    retries = checks.count(path, value, minimum=0)
    if retries > MAX_RETRIES:
        raise ConfigError(f"{path} must be <= {MAX_RETRIES}, got {retries}")
    return retries


@dataclass(frozen=True)
class FailuresConfig:
    """Worker failures of the aggregated pool (docs/failures.md): none by default."""

    at: tuple[tuple[int, float], ...] = key(
        [], _failure_list,
        doc="Failures at given instants: [[worker, at_ms], ...] (a worker already down stays down).",
        values="list of [worker >= 0, at_ms >= 0] pairs",
    )
    mtbf_ms: float | None = key(
        None, optional_number, strict=True, maximum=MAX_SCALE_MS * 52,
        doc="Random failures: each worker's time from its start or repair to its next failure is "
            "exponential with this mean (seeded); null: none.",
    )
    repair_ms: float | None = key(
        None, optional_number, strict=True, maximum=MAX_SCALE_MS,
        doc="How long a failed worker is down before it takes requests again; required with failures.",
    )
    on_failure: str = key(
        "retry", choice, allowed=FAILURE_ACTIONS,
        doc="What the client does with a request lost to a failure (KV and tokens gone): retry it "
            "(max_retries, backoff) or take it as failed.",
    )
    max_retries: int = key(
        2, _retries,
        doc="Retries of a request lost to failures (the OpenAI Python client's DEFAULT_MAX_RETRIES, 2).",
        values=f"integer in [0, {MAX_RETRIES}]",
    )
    retry_delay_ms: float = key(
        500.0, number, maximum=MAX_SCALE_MS,
        doc="Backoff before retry i: min(retry_delay_ms x 2^(i-1), max_retry_delay_ms) (the OpenAI "
            "Python client's 0.5 s and 8 s, without its jitter).",
    )
    max_retry_delay_ms: float = key(8000.0, number, maximum=MAX_SCALE_MS, doc="The backoff's ceiling.")

    @property
    def enabled(self) -> bool:
        return bool(self.at) or self.mtbf_ms is not None


@dataclass(frozen=True)
class EngineConfig:
    mode: str = key(
        "aggregated", choice, allowed=ENGINE_MODES,
        doc="aggregated: one pool of workers doing prefill and decode; disaggregated: a prefill pool and a decode pool with KV transfers.",
    )
    policy: str = key(
        "vllm", choice, allowed=POLICIES,
        doc="Scheduling policy: whose scheduler each rank runs (docs/policies.md).",
    )
    aggregated: PoolConfig = section(PoolConfig)
    prefill: PoolConfig = section(PoolConfig)
    decode: PoolConfig = section(PoolConfig)
    kv_transfer: KVTransferConfig = section(KVTransferConfig)
    autoscale: AutoscaleConfig = section(AutoscaleConfig)
    decode_autoscale: AutoscaleConfig = section(
        AutoscaleConfig, doc="P/D: autoscaling of the decode pool, on its own metric (keys as engine.autoscale).")
    failures: FailuresConfig = section(FailuresConfig)
    router: RouterConfig = field()  # keys in engine.router and engine.decode_router (see defaults)

    @classmethod
    def key_docs(cls, path: str) -> list[checks.KeyDoc]:
        """The engine's keys, then the routers' (in ``engine.router``, ``engine.decode_router``)."""
        return checks.describe(cls, path) + checks.describe(RouterConfig, path)

    @property
    def scaled(self) -> bool:
        """Whether a pool is autoscaled (``engine.autoscale`` or, P/D, ``engine.decode_autoscale``)."""
        return self.autoscale.metric != "none" or self.decode_autoscale.metric != "none"

    @property
    def pools(self) -> tuple[PoolConfig, ...]:
        """The pools in worker-index order (aggregated; or prefill, then decode)."""
        return tuple(getattr(self, name) for name in POOLS[self.mode])


def defaults() -> dict[str, Any]:
    """The ``engine`` section's default tree (a fresh copy).

    Returns
    -------
    dict[str, Any]
        The engine keys, then the routers' sections.
    """
    return {**checks.defaults(EngineConfig), **checks.defaults(RouterConfig)}


def parse_policy(raw: Mapping[str, Any], path: str = "engine") -> str:
    """Check engine.mode and engine.policy, which the timing settings read.

    Parameters
    ----------
    raw : Mapping[str, Any]
        The merged ``engine`` tree.
    path : str
        Its dotted path, for messages.

    Returns
    -------
    str
        engine.policy.
    """
    choice(f"{path}.mode", raw["mode"], ENGINE_MODES)
    return choice(f"{path}.policy", raw["policy"], POLICIES)


def parse(raw: Mapping[str, Any], path: str, timing_type: str | Mapping[str, str]) -> EngineConfig:
    """Check the ``engine`` section (after :func:`parse_policy` and the timing settings).

    Parameters
    ----------
    raw : Mapping[str, Any]
        The merged ``engine`` tree.
    path : str
        Its dotted path, for messages.
    timing_type : str or Mapping[str, str]
        timing.type (``num_blocks: auto`` needs ``aic`` or ``roofline``), or each pool's own
        (``engine.<pool>.timing.type`` merged over it) by pool name.

    Returns
    -------
    EngineConfig
        An active pool's ``num_blocks: auto`` is still ``"auto"`` (see
        :func:`simcore.derive.derive`).

    Raises
    ------
    ConfigError
        A key's value is refused (its dotted path named).
    """
    policy = parse_policy(raw, path)
    types = timing_type if isinstance(timing_type, Mapping) else {}
    pools = {
        name: Later(lambda name=name: parse_pool(
            raw[name], f"{path}.{name}", policy, types.get(name, timing_type), active=name in POOLS[raw["mode"]]
        ))
        for name in ("aggregated", "prefill", "decode")
    }
    return parse_keys(EngineConfig, raw, path, **pools, router=Later(lambda: parse_keys(RouterConfig, raw, path)))
