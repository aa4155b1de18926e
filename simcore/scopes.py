"""Where each key takes effect: a key set away from its default where the rest of the
configuration gives it no effect is an error naming it, never silently ignored
(:data:`KEY_SCOPES`, read by :func:`simcore.config.load_config` after every
section is parsed).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from simcore.checks import shown
from simcore.engine.settings import POOLS, ROUTER_WEIGHTS
from simcore.errors import ConfigError
from simcore.scheduler.settings import AUTO_BLOCKS
from simcore.settings import DEFAULTS, SimConfig
from simcore.timing.settings import AIC_ONLY_KEYS, FIXED_KEYS, LINEAR_KEYS, MODEL_KEYS, ROOFLINE_KEYS, TABLE_KEYS
from simcore.workload.settings import FILE_SOURCES, OPEN_LOOP_GENERATED, SYNTHETIC_KEYS, TRACE_KEYS, TRACE_SOURCES


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
    "kv_transfer": "disaggregated", "decode_router": "disaggregated", "decode_autoscale": "disaggregated",
    "failures": "aggregated",
}

#: Which key applies when: every such rule, read in this order by :func:`check_key_scopes`.
KEY_SCOPES = (
    *(
        KeyScope(f"engine.{name}", tuple(DEFAULTS["engine"][name]), lambda cfg, mode=mode: cfg.engine.mode == mode,
                 f"engine.mode={mode}", _setting("engine", "mode"))
        for name, mode in _SECTION_MODE.items()
    ),
    KeyScope("timing", MODEL_KEYS + ("memory_fraction",), lambda cfg: cfg.timing.type in ("aic", "roofline"),
             "timing.type=aic or roofline", _setting("timing", "type")),
    KeyScope("timing", AIC_ONLY_KEYS, lambda cfg: cfg.timing.type == "aic", "timing.type=aic",
             _setting("timing", "type")),
    KeyScope("timing.roofline", ROOFLINE_KEYS, lambda cfg: cfg.timing.type == "roofline", "timing.type=roofline",
             _setting("timing", "type")),
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
    *(
        KeyScope(f"engine.{name}", tuple(k for k in DEFAULTS["engine"][name] if k != "metric"),
                 lambda cfg, name=name: getattr(cfg.engine, name).metric != "none",
                 f"engine.{name}.metric other than none",
                 lambda cfg, name=name: f"engine.{name}.metric={getattr(cfg.engine, name).metric}", _NO_EFFECT)
        for name in ("autoscale", "decode_autoscale")
    ),
    KeyScope("engine.failures", tuple(k for k in DEFAULTS["engine"]["failures"] if k not in ("at", "mtbf_ms")),
             lambda cfg: cfg.engine.failures.enabled, "engine.failures.at or engine.failures.mtbf_ms",
             lambda cfg: "no failure configured", _NO_EFFECT),
    KeyScope("timing", ("memory_fraction",), lambda cfg: bool(_auto_pools(cfg)), "engine.<pool>.num_blocks=auto",
             lambda cfg: "no pool's num_blocks=auto", _NO_EFFECT),
    KeyScope("workload", ("priority_classes", "priority_weights"),
             lambda cfg: any(pool.queue_order == "priority" for pool in cfg.engine.pools),
             "engine.<pool>.queue_order=priority", lambda cfg: "no pool's queue_order=priority", _NO_EFFECT),
)


def check_key_scopes(cfg: SimConfig) -> None:
    """A key set (different from its default) where it has no effect is an error, not silently ignored.

    Parameters
    ----------
    cfg : SimConfig
        The parsed configuration (``resolved`` holds the merged mapping).

    Raises
    ------
    ConfigError
        Naming the first such key, its value and what it needs.
    """
    for scope in KEY_SCOPES:
        if scope.applies(cfg):
            continue
        for key in scope.keys:
            value = _section(cfg.resolved, scope.section)[key]
            if value != _section(DEFAULTS, scope.section)[key]:
                needs = scope.needs.format(pool=POOLS[cfg.engine.mode][0])  # the receiving pool
                raise ConfigError(
                    f"{scope.section}.{key} {scope.phrase} {needs}, got {shown(value)} with {scope.given(cfg)}"
                )


def check_pool_timing_scopes(cfg: SimConfig) -> None:
    """A key of ``engine.<pool>.timing`` that the pool's timing type does not read is an error, as in
    the timing section (:data:`KEY_SCOPES`); the keys it inherits from the timing section are not checked.

    Parameters
    ----------
    cfg : SimConfig
        The parsed configuration, with each active pool's timing (``pool_timing``).

    Raises
    ------
    ConfigError
        Naming ``engine.<pool>.timing.<key>`` and the pool's timing type.
    """
    for name, timing in zip(POOLS[cfg.engine.mode], cfg.pool_timing):
        if timing is cfg.timing:
            continue
        override = cfg.resolved["engine"][name]["timing"]
        view = SimConfig(**{**{f: getattr(cfg, f) for f in cfg.__dataclass_fields__}, "timing": timing})
        for scope in KEY_SCOPES:
            if not scope.section.startswith("timing") or scope.applies(view):
                continue
            sub = scope.section.split(".")[1:]
            given = override
            for part in sub:
                given = given.get(part) if isinstance(given, Mapping) else None
            if not isinstance(given, Mapping):
                continue
            for key in scope.keys:
                if key in given and given[key] != _section(DEFAULTS, scope.section)[key]:
                    dotted = ".".join([timing.path, *sub, key])
                    raise ConfigError(
                        f"{dotted} {scope.phrase} {scope.needs}, got {shown(given[key])} with "
                        f"{timing.path}.type={timing.type}"
                    )
