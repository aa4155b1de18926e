"""The one module of replaysim that uses Hydra's private API (``hydra._internal``), read from hydra-core 1.3.

Everything else uses Hydra's public API (``hydra.main``, ``hydra.initialize_config_module``,
``GlobalHydra``, ``ConfigLoader``, the override parser).  Hydra 1.3 has no public form of:

* :func:`args_parser`: Hydra's own command-line parser (``get_args_parser``).
  The override check (:func:`runners.cli.override_problem`) reads ``-m``,
  ``--config-dir`` ... and the overrides exactly as ``@hydra.main`` will,
  before Hydra runs, so that a bad override exits 2 with one line.
* :func:`skip_mode_composition`: ``Hydra.get_mode`` composes the whole config
  only to read ``hydra.mode``, before ``@hydra.main`` composes it again to run
  (about 0.05 s of every command); it is replaced when no config can set it.
* :func:`basic_sweeper`: the base of ``hydra_plugins.replaysim_sweeper.ComposeOnceSweeper``.
* The ``_target_`` names of Hydra's basic launcher and sweeper, which
  :mod:`runners.callbacks` and :mod:`runners.multirun` compare with the configured ones.
* :func:`omegaconf_str_representer`: OmegaConf's YAML representer of strings
  (``omegaconf._utils``, OmegaConf 2.3), with which :mod:`runners.multirun`
  writes a job's ``.hydra/`` records as ``OmegaConf.to_yaml`` does.

``pyproject.toml`` pins ``hydra-core>=1.3.2,<1.4``; ``tests/test_hydra_private.py``
checks each use against the installed Hydra (the version, the names and
signatures, and that ``@hydra.main`` still asks ``Hydra.get_mode``), so a Hydra
release that changes them fails there rather than in a user's run.
"""

from __future__ import annotations

import argparse

import hydra
from hydra._internal.hydra import Hydra
from hydra._internal.utils import get_args_parser

#: The hydra-core minor version whose internals this module was written against.
PINNED_VERSION = "1.3"
# Names, not imports: Hydra's plugin scan executes the modules of
# ``hydra._internal.core_plugins`` again, so a class imported from one before
# the scan is not the class Hydra then uses (``super()`` fails in it).
#: ``_target_`` of Hydra's basic launcher and sweeper (their configs in Hydra's ConfigStore).
BASIC_LAUNCHER = "hydra._internal.core_plugins.basic_launcher.BasicLauncher"
BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"


def args_parser() -> argparse.ArgumentParser:
    """Hydra's command-line parser, as ``@hydra.main`` builds it.

    Returns
    -------
    argparse.ArgumentParser
        Its namespace has ``overrides``, ``multirun``, ``config_dir``,
        ``config_path``, ``config_name`` and ``shell_completion`` among others.
    """
    return get_args_parser()


def _no_mode_from_configs(self: Hydra, config_name: str | None, overrides: list[str]) -> None:
    """``Hydra.get_mode`` when no config sets ``hydra.mode``: what it would return, without composing."""
    return None


def skip_mode_composition() -> None:
    """Make ``Hydra.get_mode`` return None (no mode set by a config) without composing the config.

    Only for a command whose configs cannot set ``hydra.mode``
    (:func:`runners.cli.mode_only_from_command_line`): then ``-m`` alone
    decides, as it does after Hydra's own composition.  For the rest of the
    process.
    """
    Hydra.get_mode = _no_mode_from_configs


def basic_sweeper() -> type:
    """Hydra's ``BasicSweeper`` class, imported when asked (from a plugin module, after Hydra's scan began).

    Returns
    -------
    type
        ``hydra._internal.core_plugins.basic_sweeper.BasicSweeper``.
    """
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    return BasicSweeper


def omegaconf_str_representer():
    """The YAML representer of ``str`` that ``OmegaConf.to_yaml`` dumps with (OmegaConf's private dumper).

    Returns
    -------
    callable
        ``representer(dumper, data) -> yaml.ScalarNode``: single-quoted when
        the text would read back as a bool, an int or a float, plain otherwise.
    """
    from omegaconf._utils import get_omega_conf_dumper

    return get_omega_conf_dumper().str_representer


def installed_version_is_pinned() -> bool:
    """Whether the installed hydra-core is of :data:`PINNED_VERSION`.

    Returns
    -------
    bool
    """
    return hydra.__version__.split(".")[:2] == PINNED_VERSION.split(".")
