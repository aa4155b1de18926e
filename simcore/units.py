"""Unit conversions, in one place (SPEC §0).

Inside the simulation every instant is an int64 nanosecond count from t = 0;
configuration and outputs use float64 milliseconds.  A conversion whose result
an int64 cannot hold is a ConfigError, never a wrapped value.
"""

from __future__ import annotations

import numpy as np

from simcore.errors import InstantOverflow

NS_PER_MS = 1_000_000

#: Sentinel for "did not happen" in int64 ns arrays.
NOT_YET = -1

INT64_MAX = 2**63 - 1
#: Validation keeps every simulated instant below half the int64 range, so that
#: an instant plus one more duration of the same size cannot wrap (simcore.bounds).
MAX_INSTANT_NS = 2**62
MAX_INSTANT_MS = MAX_INSTANT_NS / 1e6
#: float64 ns values an int64 holds: [-2**63, 2**63) (2**63 itself is a float64, not an int64).
_NS_LIMIT = 2.0**63


def ms_to_ns(ms: float, field: str = "an instant or duration") -> int:
    """Convert one duration or instant in ms to int ns, rounding half to even.

    Parameters
    ----------
    ms : float
        Duration or instant, ms.
    field : str
        What the value is, for the error message (a dotted config key).

    Returns
    -------
    int
        The same value, ns.

    Raises
    ------
    simcore.config.InstantOverflow
        A ConfigError: the value is not finite or its ns count is beyond int64.
    """
    ns = np.rint(np.float64(ms) * 1e6)
    if not -_NS_LIMIT <= ns < _NS_LIMIT:  # NaN fails both
        raise _overflow(field, ms)
    return int(ns)


def ms_array_to_ns(ms: np.ndarray, field: str = "an instant or duration") -> np.ndarray:
    """Vectorised :func:`ms_to_ns` (the same float64 product, the same rounding, the same check).

    Parameters
    ----------
    ms : array_like(float64)
        Durations or instants, ms (any shape).
    field : str
        What the values are, for the error message.

    Returns
    -------
    ndarray(int64)
        The same values, ns, same shape.
    """
    ns = np.rint(np.asarray(ms, dtype=np.float64) * 1e6)
    fits = (ns >= -_NS_LIMIT) & (ns < _NS_LIMIT)
    if not fits.all():
        raise _overflow(field, float(np.asarray(ms, dtype=np.float64)[~fits].flat[0]))
    return ns.astype(np.int64)


def _overflow(field: str, ms: float):
    return InstantOverflow(
        f"{field} of {ms!r} ms cannot be represented as int64 ns (simulated instants must stay "
        f"below {MAX_INSTANT_MS:.4g} ms, about 146 years)"
    )
