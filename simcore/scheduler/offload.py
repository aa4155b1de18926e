"""The CPU offload tier's Python side: its kernel state and results (docs/prefix-caching.md)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simcore.scheduler.settings import PoolConfig
from simcore.scheduler.offload_nb import (
    O_LOADED,
    O_REQUESTS,
    O_STORED,
    Q_CPU_FIRST,
    Q_LOAD_NS,
    Q_WIDTH,
    allocate_offload,
)


@dataclass(frozen=True)
class OffloadShape:
    """What the CPU-tier state of one configuration is built from."""

    capacity: np.ndarray  # CPU blocks per global rank (0: no tier)
    n: int  # requests
    block_ns: int  # one block's copy, ns
    block_bytes: float  # one block's KV, bytes

    @property
    def enabled(self) -> bool:
        return bool(self.capacity.any())


@dataclass
class OffloadRun:
    """Per request and summed results of the CPU tier."""

    cpu_cached_tokens: np.ndarray  # tokens loaded from the CPU tier, counted in cached_tokens
    kv_load_ns: np.ndarray  # load issue to load end, summed over the request's loads (0: none)
    loaded_bytes: float  # CPU -> GPU
    stored_bytes: float  # GPU -> CPU


def offload_shape(pool: PoolConfig, num_ranks: int, n: int) -> OffloadShape:
    """The receiving pool's tier (its ranks come first) over ``num_ranks`` global ranks.

    Parameters
    ----------
    pool : PoolConfig
        The receiving pool (aggregated, or P/D prefill).
    num_ranks : int
        Global ranks of the deployment.
    n : int
        Requests.

    Returns
    -------
    OffloadShape
        No tier (capacities all 0) when ``pool.kv_offload`` is None.
    """
    capacity = np.zeros(num_ranks, dtype=np.int64)
    offload = pool.kv_offload
    if offload is None:
        return OffloadShape(capacity, n, 0, 0.0)
    capacity[: pool.num_ranks] = offload.num_blocks
    return OffloadShape(capacity, n, offload.block_ns(pool.block_size), pool.block_size * offload.bytes_per_token)


def offload_state(shape: OffloadShape) -> np.ndarray:
    """A fresh kernel state (a header and empty ranks only when there is no tier),
    the tail of the prefix-cache state (``allocate_prefix_cache(..., tail=)``).

    Parameters
    ----------
    shape : OffloadShape

    Returns
    -------
    ndarray(int64, ndim=1)
        The state of ``simcore.scheduler.offload_nb``.
    """
    return allocate_offload(shape.capacity, shape.n if shape.enabled else 0, shape.block_ns)


def offload_results(shape: OffloadShape, state: np.ndarray) -> OffloadRun | None:
    """The tier's results out of its state after a run.

    Parameters
    ----------
    shape : OffloadShape
    state : ndarray(int64, ndim=1)
        The prefix-cache state after the run (the tier at its tail).

    Returns
    -------
    OffloadRun or None
        None without a tier.
    """
    if not shape.enabled:
        return None
    state = state[state[-1] : -1]
    requests = state[state[O_REQUESTS] : state[O_REQUESTS] + Q_WIDTH * shape.n].reshape(shape.n, Q_WIDTH)
    return OffloadRun(
        cpu_cached_tokens=requests[:, Q_CPU_FIRST].copy(),
        kv_load_ns=requests[:, Q_LOAD_NS].copy(),
        loaded_bytes=float(state[O_LOADED]) * shape.block_bytes,
        stored_bytes=float(state[O_STORED]) * shape.block_bytes,
    )
