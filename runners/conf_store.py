"""Registers the Hydra base configs (the core defaults, the runner's own keys) and ``${sample:...}``.

``base_config`` is a copy of :data:`simcore.config.DEFAULTS` (the defaults live
only in :mod:`simcore.config`); ``runner_config`` holds the keys the runner
handles itself and never passes to :func:`simcore.run` (``force``,
``sweep.batch``, ``export``; :data:`runners.sweep.RUNNER_DEFAULTS`).
``runners/conf/config.yaml`` lists both first in its defaults list.  Hydra checks only
that override keys exist; :func:`simcore.config.load_config` and
:func:`runners.sweep.split_options` validate the values.

``${sample:<file>}`` is the absolute path of a sample trace shipped in
``runners/samples/`` (the ``workload`` presets use it), so that they run from
any directory.
"""

from __future__ import annotations

import copy
from pathlib import Path

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from runners.sweep import RUNNER_DEFAULTS
from simcore.config import DEFAULTS

BASE_CONFIG = "base_config"
RUNNER_CONFIG = "runner_config"
SAMPLES_DIR = Path(__file__).resolve().parent / "samples"


def sample_path(name: str) -> str:
    """The absolute path of the shipped sample trace ``name`` (the ``${sample:name}`` resolver).

    Raises
    ------
    ValueError
        ``name`` is not a file of ``runners/samples/``; the message lists those.
    """
    path = SAMPLES_DIR / name
    if name.startswith(".") or "/" in name or not path.is_file():
        shipped = sorted(p.name for p in SAMPLES_DIR.iterdir() if p.suffix in (".csv", ".jsonl"))
        raise ValueError(f"no sample trace {name!r} (shipped: {', '.join(shipped)})")
    return str(path)


def register() -> None:
    """Store ``base_config`` (core defaults) and ``runner_config`` in Hydra's ConfigStore.

    ``sweep.batch`` is left open (not in struct mode) so that batch axes can be
    given as ``sweep.batch.load.concurrency=[1,4,16]`` without a ``+``.
    """
    store = ConfigStore.instance()
    store.store(name=BASE_CONFIG, node=copy.deepcopy(DEFAULTS))
    runner = OmegaConf.create(copy.deepcopy(RUNNER_DEFAULTS))
    OmegaConf.set_struct(runner.sweep.batch, False)
    store.store(name=RUNNER_CONFIG, node=runner)
    OmegaConf.register_new_resolver("sample", sample_path, replace=True)


register()
