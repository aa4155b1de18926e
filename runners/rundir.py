"""A rejected single run leaves no Hydra run directory behind.

Hydra creates ``hydra.run.dir`` (``outputs/<date>/<time>/`` with ``.hydra/`` and
the job log) before the task sees its config, so bad input found by the task
would leave an empty-looking run behind.  :class:`RunDirCallback`, registered in
``runners/conf/config.yaml``, notes just before Hydra creates it which
directories of that path do not exist yet; :func:`remove_new_run_dir` removes
those and only those, so a reused ``hydra.run.dir`` keeps what it held.

The state lives here, not in :mod:`runners.cli`, because that module is imported
twice under ``python -m runners.cli`` (as ``__main__`` and by Hydra's callback
instantiation).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

#: Directories of the current single run's path that this run creates, deepest first.
_new_dirs: list[Path] = []


class RunDirCallback(Callback):
    """Records the run directory's missing ancestors before Hydra creates them."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        # Same value as run_job's: ${now:...} is cached on this config object.
        try:
            run_dir = Path(str(config.hydra.run.dir)).absolute()
        except OmegaConfBaseException:  # Hydra meets it next and the command reports it in one line
            return
        _new_dirs.clear()
        for directory in (run_dir, *run_dir.parents):
            if directory.exists():
                break
            _new_dirs.append(directory)


def remove_new_run_dir() -> None:
    """Remove the run directory and its parents if this run created them (else nothing)."""
    if not _new_dirs:
        return
    shutil.rmtree(_new_dirs[0], ignore_errors=True)
    for parent in _new_dirs[1:]:
        try:
            parent.rmdir()  # only when empty: another run may have written there meanwhile
        except OSError:
            break
    _new_dirs.clear()
