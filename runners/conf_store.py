"""Registers :data:`simcore.config.DEFAULTS` as the Hydra base config ``base_config``.

The defaults live only in :mod:`simcore.config`; ``conf/config.yaml`` lists
``base_config`` first in its defaults list.  Hydra checks only that override
keys exist; :func:`simcore.config.load_config` validates the values.
"""

from __future__ import annotations

import copy

from hydra.core.config_store import ConfigStore

from simcore.config import DEFAULTS

BASE_CONFIG = "base_config"


def register() -> None:
    """Store a copy of the core defaults in Hydra's ConfigStore as ``base_config``."""
    ConfigStore.instance().store(name=BASE_CONFIG, node=copy.deepcopy(DEFAULTS))


register()
