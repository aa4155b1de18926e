"""Run directories: one per run, never shared by accident, and none left behind a rejected run.

**Unique names.**  The default ``hydra.run.dir`` (``outputs/<date>/<time>/``)
and ``hydra.sweep.dir`` (``multirun/<date>/<time>/``) are named after the
second the command started, so two runs started in the same second would
share one directory and overwrite each other's results.  A directory whose
configured name comes from ``${now:...}`` is therefore *claimed* before Hydra
uses it: created with an exclusive ``mkdir`` (atomic on local and network file
systems alike), and when another run holds that name already, the run takes
``<name>_1``, ``<name>_2``, ...  The claimed name replaces the configured one
in the config, so Hydra, the ``.hydra/`` files, the results and the printed
``Output directory`` all name the directory actually used.  A name without
``${now:...}`` (``hydra.run.dir=preset``, a sweep directory to resume) is the
user's choice of one directory and is used as given.

**Environment faults.**  A run directory that cannot be created (a read-only
or full file system, a file in the way) ends the command with one line naming
the path and the OS error, exit :data:`EXIT_ENVIRONMENT`, as ``output.dir``.

**Rejected runs.**  Hydra creates the run directory (with ``.hydra/`` and the
job log) before the task sees its config, so bad input found by the task would
leave an empty-looking run behind.  :class:`RunDirCallback`, registered in
``runners/conf/config.yaml``, notes which directories of that path this run
creates; :func:`remove_new_run_dir` removes those and only those, so a reused
``hydra.run.dir`` keeps what it held.

The state lives here, not in :mod:`runners.cli`, because that module is imported
twice under ``python -m runners.cli`` (as ``__main__`` and by Hydra's callback
instantiation).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict, read_write
from omegaconf.errors import OmegaConfBaseException

#: The results cannot be written (sysexits' EX_IOERR), as :data:`runners.cli.EXIT_ENVIRONMENT`.
EXIT_ENVIRONMENT = 74
#: Suffixes tried after the configured name is taken (``_1`` ... ``_<MAX_SUFFIX>``).
MAX_SUFFIX = 9999

#: Directories of the current run's path that this run creates, deepest first.
_new_dirs: list[Path] = []
#: The run (or sweep) directory this process claimed, None before :class:`RunDirCallback` ran.
_claimed: list[Path] = []
#: True when the claimed directory is a sweep's (:func:`remove_new_run_dir` keeps a started sweep).
_sweep = False


def is_time_stamped(config: DictConfig, key: str) -> bool:
    """True when the configured ``key`` (``hydra.run.dir``) is named by ``${now:...}``: one new directory per run."""
    node = OmegaConf.select(config, key.rpartition(".")[0])
    raw = OmegaConf.to_container(node, resolve=False).get(key.rpartition(".")[2]) if node is not None else None
    return isinstance(raw, str) and "${now:" in raw


def missing_ancestors(path: Path) -> list[Path]:
    """``path`` and its parents that do not exist, deepest first."""
    out = []
    for directory in (path, *path.parents):
        if directory.exists():
            break
        out.append(directory)
    return out


def claim(name: str, unique: bool) -> tuple[str, list[Path]]:
    """Create the directory ``name`` (its parents too) and return the name used and the directories created.

    Parameters
    ----------
    name : str
        The configured directory (relative to the working directory, or absolute).
    unique : bool
        True: the directory must be new to this run; when ``name`` exists the
        first free ``<name>_<k>`` is taken (an exclusive ``mkdir``, so two
        processes never get the same).  False: ``name`` is used whether or not
        it exists.

    Returns
    -------
    (str, list of Path)
        The name used (``name`` or ``name_<k>``, relative when ``name`` is), and
        the absolute directories this call created, deepest first.

    Raises
    ------
    OSError
        The directory cannot be created (read-only, full, a file in the way),
        or every suffix is taken (``EEXIST``).
    """
    target = Path(name).absolute()
    created = missing_ancestors(target.parent)
    target.parent.mkdir(parents=True, exist_ok=True)
    if not unique:
        if not target.exists():
            target.mkdir(exist_ok=True)
            created.insert(0, target)
        elif not target.is_dir():
            raise FileExistsError(17, "File exists (not a directory)", str(target))
        return name, created
    for k in range(MAX_SUFFIX + 1):
        candidate = name if k == 0 else f"{name.rstrip('/')}_{k}"
        try:
            os.mkdir(Path(candidate).absolute())
        except FileExistsError:
            continue
        return candidate, [Path(candidate).absolute(), *created]
    raise FileExistsError(17, f"File exists ({MAX_SUFFIX + 1} runs of that name)", str(target))


def _environment_exit(config: DictConfig, exc: OSError, name: str) -> None:
    """One line naming the directory and the OS error, then exit :data:`EXIT_ENVIRONMENT`."""
    remove_new_run_dir()
    prog = OmegaConf.select(config, "hydra.job.name", default=None) or "replaysim"
    reason = os.strerror(exc.errno) if exc.errno else " ".join(str(exc).split())
    print(f"{prog}: error: cannot write results to {exc.filename or name}: {reason}", file=sys.stderr, flush=True)
    raise SystemExit(EXIT_ENVIRONMENT)


def _take(config: DictConfig, key: str) -> str | None:
    """Claim the directory of ``key`` and write the name used back into ``config``; None if unresolvable."""
    global _sweep
    _sweep = key == "hydra.sweep.dir"
    try:
        name = str(OmegaConf.select(config, key, throw_on_missing=True))
    except OmegaConfBaseException:  # Hydra meets it next and the command reports it in one line
        return None
    _new_dirs.clear()
    _claimed.clear()
    try:
        used, created = claim(name, is_time_stamped(config, key))
    except OSError as exc:
        _environment_exit(config, exc, name)
    _new_dirs.extend(created)
    _claimed.append(Path(used).absolute())
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(config, parent)
    with read_write(node), open_dict(node):
        node[leaf] = used
    return used


def _override_value(text: str) -> str:
    """``text`` as a quoted Hydra override value."""
    escaped = text.replace("\\", "\\\\").replace("'", "\\'").replace("${", "\\${")
    return f"'{escaped}'"


class RunDirCallback(Callback):
    """Claims the run (or sweep) directory and records which of its directories the run creates."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        _take(config, "hydra.run.dir")

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        unique = is_time_stamped(config, "hydra.sweep.dir")
        used = _take(config, "hydra.sweep.dir")
        if used is None or not unique:
            return
        # Each job's config is composed again from the command line's hydra
        # overrides (Hydra's load_sweep_config): they get the claimed name too.
        overrides = config.hydra.overrides
        with read_write(overrides), open_dict(overrides):
            overrides.hydra.append(f"hydra.sweep.dir={_override_value(used)}")


def claimed_dir() -> Path | None:
    """The run or sweep directory this process claimed (None: none yet)."""
    return _claimed[0] if _claimed else None


def remove_new_run_dir() -> None:
    """Remove the run directory and its parents if this run created them (else nothing).

    A sweep directory is removed only while no job has a directory in it
    (bad input found before the first job): a sweep's finished points stay.
    """
    if not _new_dirs:
        return
    if _sweep and _new_dirs[0].is_dir() and any(p.is_dir() for p in _new_dirs[0].iterdir()):
        _new_dirs.clear()
        return
    shutil.rmtree(_new_dirs[0], ignore_errors=True)
    for parent in _new_dirs[1:]:
        try:
            parent.rmdir()  # only when empty: another run may have written there meanwhile
        except OSError:
            break
    _new_dirs.clear()
