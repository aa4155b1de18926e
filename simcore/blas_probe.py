"""numba's BLAS probe answered without importing ``scipy.linalg`` (issue 14: start-up).

When numba loads its first cached kernel it imports ``numba.np.arraymath``,
which asks at import time whether BLAS is available by importing
``scipy.linalg.cython_blas``: about 0.1 s of ``scipy.linalg`` for a question
that only matters to ``np.dot``-like code, which no simcore kernel uses.
:func:`install` makes that one import-time question a ``find_spec("scipy")``
(the same answer while scipy is installed) and restores numba's own check at
once, so any kernel that does use BLAS still checks and imports it.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys

_PROBED_MODULE = "numba.np.arraymath"


class _BeforeArraymath(importlib.abc.MetaPathFinder):
    """Swaps numba's BLAS check for one call just before ``numba.np.arraymath`` is imported."""

    def find_spec(self, name, path=None, target=None):
        if name != _PROBED_MODULE:
            return None
        sys.meta_path.remove(self)
        from numba.np import linalg  # what arraymath imports its check from

        real_check = linalg.ensure_blas

        def scipy_installed():
            linalg.ensure_blas = real_check  # every later caller gets numba's own check
            if importlib.util.find_spec("scipy") is None:
                raise ImportError("scipy is required for BLAS")

        linalg.ensure_blas = scipy_installed
        return None  # the ordinary finders import arraymath


def install() -> None:
    """Defer the import of ``scipy.linalg`` that numba's first kernel load makes (no-op once arraymath is imported)."""
    if _PROBED_MODULE not in sys.modules and not any(isinstance(f, _BeforeArraymath) for f in sys.meta_path):
        sys.meta_path.insert(0, _BeforeArraymath())
