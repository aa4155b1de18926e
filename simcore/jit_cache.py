"""Where numba caches simcore's compiled kernels: one directory per version of the kernel sources.

numba keys a cached function on its own source file only.  A cached kernel
that calls a jitted function from another module (the engine kernel calls the
scheduler's, the timing models' and the metrics' kernels) keeps the old code
of that function after its module changes, and gives wrong results without an
error (numba issues #1833 and #9483).  So the cache directory is named after a
fingerprint of every kernel module: a change to any of them starts a fresh
cache, compiled once.  The directory is ``$NUMBA_CACHE_DIR/replaysim-<fp>``
when that variable is set, else ``simcore/__pycache__/numba-<fp>`` (or
``~/.cache/replaysim/numba-<fp>`` when the package directory is read-only).

:func:`configure` must run before any kernel module is imported; importing
``simcore`` does it.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numba

PACKAGE_DIR = Path(__file__).resolve().parent


def kernel_modules(root: Path = PACKAGE_DIR) -> list[Path]:
    """The modules that hold numba kernels (``nb.py``, ``*_nb.py``) or constants they freeze (``enums.py``), in a fixed order.

    Parameters
    ----------
    root : Path
        The package directory.

    Returns
    -------
    list of Path
    """
    return sorted([*root.rglob("*nb.py"), root / "enums.py"])


def fingerprint(root: Path = PACKAGE_DIR) -> str:
    """16 hex digits of the SHA-1 of every kernel module's path and content.

    Parameters
    ----------
    root : Path
        The package directory.

    Returns
    -------
    str
    """
    digest = hashlib.sha1()
    for path in kernel_modules(root):
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def configure() -> Path:
    """Point numba's cache at this version's directory (see the module docstring).

    Returns
    -------
    Path
        The cache directory.
    """
    name = fingerprint()
    user_dir = os.environ.get("NUMBA_CACHE_DIR")
    if user_dir:
        path = Path(user_dir) / f"replaysim-{name}"
    elif os.access(PACKAGE_DIR, os.W_OK):
        path = PACKAGE_DIR / "__pycache__" / f"numba-{name}"
    else:
        path = Path.home() / ".cache" / "replaysim" / f"numba-{name}"
    numba.config.CACHE_DIR = str(path)
    return path


def engine_kernel_cached() -> bool:
    """True when numba's cache holds an index for the engine kernel (``simulate_engine_nb``).

    Without one, the first run compiles the kernels (about half a minute).
    The index is the file numba writes beside a cached kernel's compiled
    code; its presence does not prove that this run's argument types (the
    output mode) are among the compiled ones, so a first run of another mode
    can still compile without being announced.
    """
    from simcore.engine import nb  # imported here: configure() must run first

    kernel = nb.simulate_engine_nb
    prefix = f"{kernel.py_func.__module__.rsplit('.', 1)[-1]}.{kernel.py_func.__qualname__}-"
    try:
        return any(name.startswith(prefix) and name.endswith(".nbi") for name in os.listdir(kernel.stats.cache_path))
    except OSError:
        return False
