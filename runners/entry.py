"""Console-script entry points that answer ``--help`` before importing Hydra or the kernels.

``replaysim --help`` and ``replaysim-capacity --help`` print the texts
:mod:`runners.options` wrote from the keys' declarations (a few hundredths of
a second); every other invocation imports the command's module and runs it.
"""

from __future__ import annotations

import importlib
import sys

HELP_FLAGS = ("--help", "-h")


def wants_help(argv: list[str]) -> bool:
    """Whether the command line asks for the app's help (``--hydra-help`` is Hydra's own)."""
    return any(arg in HELP_FLAGS for arg in argv)


def _run(command: str, module: str) -> None:
    if wants_help(sys.argv[1:]):
        from runners.options import print_help

        print_help(command)
        return
    importlib.import_module(module).main()


def replaysim() -> None:
    """``replaysim``."""
    _run("replaysim", "runners.cli")


def replaysim_capacity() -> None:
    """``replaysim-capacity``."""
    _run("replaysim-capacity", "runners.capacity")
