"""Unit conversions, in one place (SPEC §0).

Inside the simulation every instant is an int64 nanosecond count from t = 0;
configuration and outputs use float64 milliseconds.
"""

from __future__ import annotations

import numpy as np

NS_PER_MS = 1_000_000

#: Sentinel for "did not happen" in int64 ns arrays.
NOT_YET = -1


def ms_to_ns(ms: float) -> int:
    """Convert one duration or instant in ms to int ns, rounding half to even.

    Parameters
    ----------
    ms : float
        Duration or instant, ms.

    Returns
    -------
    int
        The same value, ns.
    """
    return int(np.rint(ms * 1e6))


def ms_array_to_ns(ms: np.ndarray) -> np.ndarray:
    """Vectorised :func:`ms_to_ns` (the same float64 product, the same rounding).

    Parameters
    ----------
    ms : array_like(float64)
        Durations or instants, ms (any shape).

    Returns
    -------
    ndarray(int64)
        The same values, ns, same shape.
    """
    return np.rint(np.asarray(ms, dtype=np.float64) * 1e6).astype(np.int64)
