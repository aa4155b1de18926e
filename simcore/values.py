"""How a number read from a file or the Python API stands for an integer, written once.

Config count keys take an integral float up to 2**53 (``1e6``,
``simcore.checks.count``); values
read from tables, traces and profiles may be written as integral floats
(``12.0``, ``1e3``), as CSV writers and JSON encoders often do.
"""

from __future__ import annotations

import math
from typing import Any


def integral(value: Any) -> int | None:
    """The integer that ``value`` stands for: an int (not a bool) or a finite integral float; else None.

    Parameters
    ----------
    value : Any
        A parsed number (text is converted by the caller, which names the error).

    Returns
    -------
    int or None
        The value as an int, exactly for an int and by ``int()`` for a float.
    """
    if isinstance(value, float):
        return int(value) if math.isfinite(value) and value.is_integer() else None
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return None
