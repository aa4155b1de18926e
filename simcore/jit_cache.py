"""Where numba caches simcore's compiled kernels: one directory per version of the kernel sources.

numba keys a cached function on its own source file only.  A cached kernel
that calls a jitted function from another module (the engine kernel calls the
scheduler's, the timing models' and the metrics' kernels) keeps the old code
of that function after its module changes, and gives wrong results without an
error (numba issues #1833 and #9483).  So the cache directory is named after a
fingerprint of every kernel module: a change to any of them starts a fresh
cache, compiled once.  The directory is ``$NUMBA_CACHE_DIR/replaysim-<fp>``
when that variable is set, else ``$XDG_CACHE_HOME/replaysim/numba-<fp>``
(``~/.cache`` without it), created with mode 0700.

numba's index files are pickles: whoever can write the cache directory can
run code in every process that loads it.  So the default directory is the
user's own, and a ``NUMBA_CACHE_DIR`` that another user can write (group or
others write permission, another owner) gets a :class:`SharedCacheWarning`.

:func:`configure` must run before any kernel module is imported; importing
``simcore`` does it.
"""

from __future__ import annotations

import hashlib
import os
import stat
import warnings
from pathlib import Path

import numba

PACKAGE_DIR = Path(__file__).resolve().parent


def kernel_modules(root: Path = PACKAGE_DIR) -> list[Path]:
    """The modules that hold numba kernels (``nb.py``, ``*_nb.py``), constants they freeze (``enums.py``) or the state tuples they build (``state.py``), in a fixed order.

    Parameters
    ----------
    root : Path
        The package directory.

    Returns
    -------
    list of Path
    """
    return sorted([*root.rglob("*nb.py"), *root.rglob("state.py"), root / "enums.py"])


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


class SharedCacheWarning(UserWarning):
    """``NUMBA_CACHE_DIR`` can be written by other users, who could run code in this process."""


def user_cache_root() -> Path:
    """``$XDG_CACHE_HOME/replaysim`` (default ``~/.cache/replaysim``)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "replaysim"


def writable_by_others(path: Path) -> str | None:
    """Why users other than this one can write ``path`` or a directory above it, or None.

    Checks group and others write permission and the owner of ``path`` and of
    each parent (a sticky ``/tmp`` does not let others replace what this user
    owns in it, so a sticky parent is not counted).

    Parameters
    ----------
    path : Path
        A cache directory (it or its parents may not exist yet).

    Returns
    -------
    str or None
        The first directory found writable by others, and why.
    """
    uid = os.geteuid()
    for where in (path, *path.parents):
        try:
            info = where.stat()
        except OSError:
            continue  # not created yet
        if info.st_uid not in (uid, 0):
            return f"{where} belongs to uid {info.st_uid}"
        if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not (where != path and info.st_mode & stat.S_ISVTX):
            return f"{where} is writable by {'others' if info.st_mode & stat.S_IWOTH else 'its group'}"
    return None


def configure() -> Path:
    """Point numba's cache at this version's directory (see the module docstring).

    Returns
    -------
    Path
        The cache directory.  The default one is created with mode 0700 (when
        it cannot be, numba reports it on the first cached compile).
    """
    name = fingerprint()
    user_dir = os.environ.get("NUMBA_CACHE_DIR")
    if user_dir:
        path = Path(user_dir) / f"replaysim-{name}"
        reason = writable_by_others(path)
        if reason:
            warnings.warn(
                f"NUMBA_CACHE_DIR={user_dir}: {reason}; numba's cache index files are pickles, so whoever "
                "can write there can run code in replaysim (docs/sweeps.md)",
                SharedCacheWarning, stacklevel=2,
            )
    else:
        path = user_cache_root() / f"numba-{name}"
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            path.mkdir(mode=0o700, exist_ok=True)
        except OSError:
            pass
    numba.config.CACHE_DIR = str(path)
    return path


def engine_kernel_cached() -> bool:
    """True when numba's cache holds an index for the engine kernel (``simulate_engine_nb``).

    Without one, the first run compiles the kernels (about eight minutes of one
    core for the embedded default at the last measurement: ``docs/performance.md``, "Cold compile").
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
