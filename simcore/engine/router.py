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
from simcore.engine.autoscale_nb import NUM_PARAMS, NUM_POOLS, P_INTERVAL, P_METRIC, P_MIN, P_STARTUP
from simcore.engine.failures_nb import (
    F_ACTION, F_DELAY, F_GAPS, F_MAX_DELAY, F_ON, F_REPAIR, F_RETRIES, FAIL_REJECT, FAIL_RETRY, NUM_FAIL_PARAMS,
)
from simcore.engine.settings import AUTOSCALE_METRICS
from simcore.units import ms_to_ns

#: Spawn keys of the two draw streams under the run seed: the receiving pool's
#: decisions (one per send), the decode pool's (one per handoff).
RECEIVING_STREAM = 1
DECODE_STREAM = 2
#: Spawn key of the random failures' gaps (docs/failures.md).
FAILURE_STREAM = 3
#: Random failures drawn per worker: after that many, a worker fails no more (docs/failures.md).
FAILURE_GAPS = 64
#: The longest gap drawn, ns (2^60: bounds the instants' arithmetic).
MAX_GAP_NS = 1 << 60


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
        **fail_inputs(cfg, len(topology.worker_role)),
    )


def failure_gaps(seed: int, workers: int, mtbf_ms: float) -> np.ndarray:
    """Each worker's ``FAILURE_GAPS`` times to its next failure, ns: exponential of mean ``mtbf_ms``, rounded,
    within [1, 2^60]; worker w's at ``w x FAILURE_GAPS ..``.

    Parameters
    ----------
    seed : int
        The run seed (spawn key ``FAILURE_STREAM``).
    workers : int
        Workers of the pool.
    mtbf_ms : float
        Mean time between failures (from a start or repair), ms.

    Returns
    -------
    ndarray(int64, ndim=1)
    """
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(FAILURE_STREAM,)))
    gaps = np.rint(rng.exponential(mtbf_ms * 1e6, (workers, FAILURE_GAPS)))
    return np.clip(gaps, 1, MAX_GAP_NS).astype(np.int64).ravel()


def fail_inputs(cfg: SimConfig, workers: int) -> dict:
    """``Router.fail``, ``fail_at`` and ``fail_gaps``: the failures' parameters (``fail[F_ON]`` 0: none).

    Parameters
    ----------
    cfg : SimConfig
        The run's configuration (``engine.failures``, the seed).
    workers : int
        Workers of the pool.

    Returns
    -------
    dict
    """
    fail = cfg.engine.failures
    params = np.zeros(NUM_FAIL_PARAMS, dtype=np.int64)
    empty = np.zeros(0, dtype=np.int64)
    if not fail.enabled:
        return {"fail": params, "fail_at": empty, "fail_gaps": empty}
    params[F_ON] = 1
    params[F_ACTION] = FAIL_RETRY if fail.on_failure == "retry" else FAIL_REJECT
    params[F_RETRIES] = fail.max_retries
    params[F_DELAY] = ms_to_ns(fail.retry_delay_ms, "engine.failures.retry_delay_ms")
    params[F_MAX_DELAY] = ms_to_ns(fail.max_retry_delay_ms, "engine.failures.max_retry_delay_ms")
    params[F_REPAIR] = ms_to_ns(fail.repair_ms, "engine.failures.repair_ms")
    at = sorted((ms_to_ns(at_ms, "engine.failures.at"), worker) for worker, at_ms in fail.at)
    gaps = empty
    if fail.mtbf_ms is not None:
        params[F_GAPS] = FAILURE_GAPS
        gaps = failure_gaps(cfg.seed, workers, fail.mtbf_ms)
    return {"fail": params, "fail_at": np.array([v for pair in at for v in pair], dtype=np.int64), "fail_gaps": gaps}


def scale_inputs(cfg: SimConfig) -> dict:
    """``Router.scale`` and ``Router.scale_target``: the autoscaling parameters of each pool (metric code 0: off).

    Pool 0 is the receiving pool (``engine.autoscale``), pool 1 the P/D decode
    pool (``engine.decode_autoscale``), ``NUM_PARAMS`` each.

    Parameters
    ----------
    cfg : SimConfig
        The run's configuration (``engine.autoscale``, ``engine.decode_autoscale``).

    Returns
    -------
    dict
    """
    params = np.zeros(NUM_POOLS * NUM_PARAMS, dtype=np.int64)
    targets = np.ones(NUM_POOLS, dtype=np.float64)
    for p, section in enumerate(("autoscale", "decode_autoscale")):
        scale = getattr(cfg.engine, section)
        if scale.metric == "none" or (p == 1 and cfg.engine.mode != "disaggregated"):
            continue
        base = p * NUM_PARAMS
        params[base + P_METRIC] = AUTOSCALE_METRICS.index(scale.metric)
        params[base + P_INTERVAL] = ms_to_ns(scale.interval_ms, f"engine.{section}.interval_ms")
        params[base + P_MIN] = scale.min_replicas
        params[base + P_STARTUP] = ms_to_ns(scale.startup_ms, f"engine.{section}.startup_ms")
        targets[p] = scale.target
    return {"scale": params, "scale_target": targets}
