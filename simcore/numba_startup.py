"""numba's set-ups that a cached kernel does not need, deferred until something does (issues 14, 34: start-up).

Loading a kernel from numba's cache (``Cache.load_overload``) first refreshes
the target context: it imports and installs every typing and lowering
registry of numba (``numba.np.arraymath``, ``numba.cpython.*``, the typed
containers, ...; about 0.17 CPU-s of a warm default run here), as a
compilation needs them.  A cached kernel is rebuilt from its object code and
needs only numba's runtime (NRT) initialised for its symbols, so
:func:`install` makes the cache load initialise the runtime alone; the first
compilation in the process (``numba.core.compiler``'s pipeline refreshes both
contexts itself) still loads the registries, and a cached kernel's results
are the same either way (``tests/test_numba_startup.py``).

When the registries are loaded (a compilation), two of their modules do
costly work at import that no simcore kernel needs:

- ``numba.np.arraymath`` asks whether BLAS is available by importing
  ``scipy.linalg.cython_blas`` (about 0.1 s of ``scipy.linalg``), for
  ``np.dot``-like code.  While it is imported, that check is answered by
  ``find_spec("scipy")`` (the same answer while scipy is installed); every
  later caller (a kernel that does use BLAS) gets numba's own check.
- ``numba.core.typing.cffi_utils`` builds a ``cffi.FFI()`` (about 0.04 s of
  parsing C declarations) for typing cffi objects.  While it is imported, the
  instance it makes is one that builds the real ``FFI`` on first use.

:func:`install` must run before numba loads a kernel; importing ``simcore`` does it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from contextlib import contextmanager


@contextmanager
def _blas_check_by_scipy_spec():
    from numba.np import linalg  # what arraymath imports its check from

    real_check = linalg.ensure_blas

    def scipy_installed():
        if importlib.util.find_spec("scipy") is None:
            raise ImportError("scipy is required for BLAS")

    linalg.ensure_blas = scipy_installed
    try:
        yield
    finally:
        linalg.ensure_blas = real_check


class _FFIOnFirstUse:
    """Stands for a ``cffi.FFI()``, built when an attribute is first asked for."""

    def __init__(self):
        self._real = None

    def __getattr__(self, name):
        if self._real is None:
            import cffi

            self._real = cffi.FFI()
        return getattr(self._real, name)


@contextmanager
def _ffi_on_first_use():
    try:
        import cffi
    except ImportError:  # numba then does without cffi support
        yield
        return
    real_class = cffi.FFI
    cffi.FFI = _FFIOnFirstUse  # cffi_utils' module-level ``ffi = cffi.FFI()``
    try:
        yield
    finally:
        cffi.FFI = real_class  # its isinstance(obj, cffi.FFI) checks see the real class


#: Module -> the context its body is executed in.
_DEFERRED = {
    "numba.np.arraymath": _blas_check_by_scipy_spec,
    "numba.core.typing.cffi_utils": _ffi_on_first_use,
}


class _Loader(importlib.abc.Loader):
    def __init__(self, loader, context):
        self.loader, self.context = loader, context

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        with self.context():
            self.loader.exec_module(module)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds the modules of ``_DEFERRED`` as usual and executes them in their context."""

    def find_spec(self, name, path=None, target=None):
        context = _DEFERRED.get(name)
        if context is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader, context)
        return spec


#: numba's own ``Cache.load_overload`` (before :func:`install` replaced it).
NUMBA_LOAD_OVERLOAD = None


def _load_overload_with_runtime_only(self, sig, target_context):
    """numba's ``Cache.load_overload`` with the runtime initialised instead of the whole context refreshed."""
    from numba.core.runtime import rtsys

    rtsys.initialize(target_context)
    with self._guard_against_spurious_io_errors():
        return self._load_overload(sig, target_context)


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (once; no effect on modules already imported) and make
    numba's cache loads initialise only the runtime."""
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
    global NUMBA_LOAD_OVERLOAD
    from numba.core import caching

    if caching.Cache.load_overload is not _load_overload_with_runtime_only:
        NUMBA_LOAD_OVERLOAD = caching.Cache.load_overload
        caching.Cache.load_overload = _load_overload_with_runtime_only
