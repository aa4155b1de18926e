"""Per-request receipt statistics and the ITL distribution built from them.

Both output modes reduce receipts to the same per-request integers
(``simcore.receipts_nb.RECEIPT_FIELDS``, :class:`simcore.receipts.Receipts`): the detailed mode from its per-token
array after the run, the bounded mode while the run goes.  The ITL mean, std,
min and max come from these integers, exactly (sums of ns in unbounded Python
integers), so they are bit-identical in the two modes; ITL percentiles come
from an exact radix selection over the receipts (detailed) or from the
log-linear bucket sketch (bounded, within ``SKETCH_ALPHA`` relative).
"""

from __future__ import annotations

import math

import numpy as np

from simcore.metrics.nb import SQ_BITS, itl_order_statistics_nb, sketch_values
from simcore.receipts import Receipts, allocate_stream_state, completed_mask  # noqa: F401  re-exported

_SPLIT = 31  # bits summed separately, so that sums of int64 values cannot overflow


def _exact_sum(values: np.ndarray) -> int:
    """Sum of non-negative int64 values as a Python int (no int64 overflow)."""
    return (int(np.sum(values >> _SPLIT)) << _SPLIT) + int(np.sum(values & ((1 << _SPLIT) - 1)))


def itl_moments(receipts: Receipts, completed: np.ndarray) -> tuple[int, float, float, float, float] | None:
    """Count, mean, std, min and max of the ITL gaps of the completed requests.

    Parameters
    ----------
    receipts : Receipts
    completed : ndarray(bool, ndim=1)
        The requests whose gaps count.

    Returns
    -------
    tuple or None
        ``(count, mean_ms, std_ms, min_ms, max_ms)`` (population std); None
        when no completed request has two receipts.
    """
    several = completed & (receipts.num_received >= 2)
    count = int(np.sum(receipts.num_received[several] - 1))
    if count == 0:
        return None
    total = _exact_sum(receipts.last_recv_ns[several] - receipts.first_recv_ns[several])
    squares = (_exact_sum(receipts.gap_sq_hi[several]) << SQ_BITS) + _exact_sum(receipts.gap_sq_lo[several])
    variance_ns2 = (count * squares - total * total) / (count * count)  # exact integers, one rounding
    return (
        count,
        total / (count * 1_000_000),
        math.sqrt(variance_ns2) / 1e6,
        float(receipts.gap_min_ns[several].min()) / 1e6,
        float(receipts.gap_max_ns[several].max()) / 1e6,
    )


def linear_percentiles(order_statistics, count: int, percentiles) -> list[float]:
    """``numpy.percentile``'s linear method over ``count`` sorted values read by rank.

    Parameters
    ----------
    order_statistics : callable
        0-based ranks (ndarray(int64)) -> the values at those ranks (ndarray(float64)).
    count : int
        Number of values, >= 1.
    percentiles : sequence of float
        0..100.

    Returns
    -------
    list of float
        One value per percentile, interpolated as numpy's ``_lerp`` does.
    """
    virtual = (count - 1) * (np.asarray(percentiles, dtype=np.float64) / 100)
    below = np.floor(virtual).astype(np.int64)
    above = np.minimum(below + 1, count - 1)
    gamma = virtual - below
    low, high = np.split(order_statistics(np.concatenate((below, above))), 2)  # one call: one selection
    diff = high - low
    return [float(v) for v in np.where(gamma >= 0.5, high - diff * (1 - gamma), low + diff * gamma)]


def exact_itl_percentiles(
    token_offset: np.ndarray, token_recv_ns: np.ndarray, receipts: Receipts, completed: np.ndarray, count: int, percentiles
) -> list[float]:
    """ITL percentiles (ms) from the per-token receipts, exactly as ``numpy.percentile`` of the pooled gaps.

    Parameters
    ----------
    token_offset, token_recv_ns : ndarray(int64, ndim=1)
        Token offsets and receipts (ns, -1: not received).
    receipts : Receipts
    completed : ndarray(bool, ndim=1)
        Requests whose gaps are pooled.
    count : int
        Number of pooled gaps, >= 1.
    percentiles : sequence of float
        0..100.

    Returns
    -------
    list of float
    """
    max_gap = int(receipts.gap_max_ns[completed].max())

    def order_statistics(ranks):
        wanted = np.unique(ranks)
        values = np.empty(wanted.shape[0], dtype=np.int64)
        itl_order_statistics_nb(token_offset, token_recv_ns, receipts.num_received, completed, max_gap, wanted, values)
        return values[np.searchsorted(wanted, ranks)] / 1e6

    return linear_percentiles(order_statistics, count, percentiles)


def sketch_percentiles(sketch: np.ndarray, percentiles, min_ms: float, max_ms: float) -> list[float]:
    """Linear-interpolation percentiles (as ``numpy.percentile``) read from the ITL sketch.

    Each order statistic is its bucket's representative, clamped to the exact
    min and max, so it is within ``SKETCH_ALPHA`` relative of the exact one,
    and so is their interpolation.

    Parameters
    ----------
    sketch : ndarray(int64, ndim=1)
        Bucket counts.
    percentiles : sequence of float
        0..100.
    min_ms, max_ms : float
        The exact smallest and largest gap, ms.

    Returns
    -------
    list of float
        One value per percentile, ms.
    """
    cumulative = np.cumsum(sketch)

    def order_statistics(ranks):
        values = sketch_values(np.searchsorted(cumulative, ranks, side="right")) / 1e6
        return np.clip(values, min_ms, max_ms)

    return linear_percentiles(order_statistics, int(cumulative[-1]), percentiles)
