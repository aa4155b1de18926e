"""The routing inputs of the engine kernel (``simcore.engine.router_nb``, docs/routing.md).

The kernel decides; this module only turns the configuration into codes and
draws the seeded candidates of ``random`` and ``power_of_two`` (randomness
stays outside kernels).
"""

from __future__ import annotations

import numpy as np

from simcore.settings import SimConfig
from simcore.engine.state import Router, Topology
from simcore.enums import RANK_POLICIES, ROUTER_POLICIES, RouterPolicy
from simcore.engine.autoscale_nb import NUM_PARAMS, P_INTERVAL, P_METRIC, P_MIN, P_STARTUP
from simcore.engine.settings import AUTOSCALE_METRICS
from simcore.units import ms_to_ns

#: Spawn keys of the two draw streams under the run seed: the receiving pool's
#: decisions (one per send), the decode pool's (one per handoff).
RECEIVING_STREAM = 1
DECODE_STREAM = 2


def route_draws(seed: int, stream: int, decisions: int, workers: int) -> np.ndarray:
    """Two distinct seeded workers (0 .. workers - 1) per decision, interleaved.

    Parameters
    ----------
    seed : int
        The run seed.
    stream : int
        ``RECEIVING_STREAM`` or ``DECODE_STREAM``.
    decisions : int
        Decisions (sends, or handoffs): at most the requests.
    workers : int
        Workers of the pool.

    Returns
    -------
    ndarray(int64, ndim=1)
        ``2 x decisions``: decision d's first draw at ``2d`` (uniform), its
        second at ``2d + 1`` (uniform over the others; equal to the first
        only with one worker).
    """
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(stream,)))
    first = rng.integers(0, workers, decisions, dtype=np.int64)
    second = rng.integers(0, max(workers - 1, 1), decisions, dtype=np.int64)
    if workers > 1:
        second += second >= first
    draws = np.empty(2 * decisions, dtype=np.int64)
    draws[0::2] = first
    draws[1::2] = second
    return draws


def router_inputs(cfg: SimConfig, n: int, topology: Topology, tok_index: np.ndarray) -> Router:
    """The kernel's ``Router`` for one configuration of ``n`` requests.

    Parameters
    ----------
    cfg : SimConfig
    n : int
        Requests.
    topology : Topology
        The workers (the receiving pool first).
    tok_index : ndarray(int64, ndim=1)
        Each request's tokenizer server within its worker.

    Returns
    -------
    Router
    """
    pools = cfg.engine.pools
    router = cfg.engine.router
    policy = ROUTER_POLICIES.index(router.policy)
    decode_policy = ROUTER_POLICIES.index(router.decode_policy)
    seeded = (RouterPolicy.random, RouterPolicy.power_of_two)
    no_draws = np.zeros(0, dtype=np.int64)
    return Router(
        policy=policy,
        decode_policy=decode_policy,
        rank_policy=np.repeat(
            np.array([RANK_POLICIES.index(pool.rank_policy) for pool in pools], dtype=np.int64),
            [pool.replicas for pool in pools],
        ),
        weights=np.array(router.weights, dtype=np.float64),
        draws=route_draws(cfg.seed, RECEIVING_STREAM, n, pools[0].replicas) if policy in seeded else no_draws,
        decode_draws=(
            route_draws(cfg.seed, DECODE_STREAM, n, pools[-1].replicas)
            if len(pools) == 2 and decode_policy in seeded else no_draws
        ),
        tok_index=tok_index,
        tok_workers=cfg.tokenization.workers,
        **scale_inputs(cfg),
    )


def scale_inputs(cfg: SimConfig) -> dict:
    """``Router.scale`` and ``Router.scale_target``: the autoscaling parameters (metric code 0: off)."""
    scale = cfg.engine.autoscale
    if scale.metric == "none":
        return {"scale": np.zeros(NUM_PARAMS, dtype=np.int64), "scale_target": np.ones(1, dtype=np.float64)}
    params = np.zeros(NUM_PARAMS, dtype=np.int64)
    params[P_METRIC] = AUTOSCALE_METRICS.index(scale.metric)
    params[P_INTERVAL] = ms_to_ns(scale.interval_ms, "engine.autoscale.interval_ms")
    params[P_MIN] = scale.min_replicas
    params[P_STARTUP] = ms_to_ns(scale.startup_ms, "engine.autoscale.startup_ms")
    return {"scale": params, "scale_target": np.array([scale.target], dtype=np.float64)}
