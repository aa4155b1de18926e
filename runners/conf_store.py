"""Registers the Hydra base configs: the core defaults and the runner's own keys.

``base_config`` is a copy of :data:`simcore.config.DEFAULTS` (the defaults live
only in :mod:`simcore.config`); ``runner_config`` holds the keys the runner
handles itself and never passes to :func:`simcore.run` (``force``,
``sweep.batch``, ``export``; :data:`runners.sweep.RUNNER_DEFAULTS`).
``conf/config.yaml`` lists both first in its defaults list.  Hydra checks only
that override keys exist; :func:`simcore.config.load_config` and
:func:`runners.sweep.split_options` validate the values.
"""

from __future__ import annotations

import copy

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from runners.sweep import RUNNER_DEFAULTS
from simcore.config import DEFAULTS

BASE_CONFIG = "base_config"
RUNNER_CONFIG = "runner_config"


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


register()
