"""replaysim's private uses of Hydra, all in runners/hydra_private.py, still hold for the installed Hydra.

A Hydra release that renames, moves or reshapes one of them fails here (see
that module's docstring for why each has no public form).
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import hydra
from hydra._internal import utils as hydra_utils
from hydra._internal.hydra import Hydra

from runners import hydra_private

ROOT = Path(__file__).resolve().parents[1]


def test_the_installed_hydra_is_the_pinned_version():
    assert hydra_private.installed_version_is_pinned(), hydra.__version__
    assert f'"hydra-core>=1.3.2,<{hydra_private.PINNED_VERSION[:-1]}{int(hydra_private.PINNED_VERSION[-1]) + 1}"' in (
        ROOT / "pyproject.toml").read_text()


def test_hydras_parser_reads_the_flags_the_override_check_uses():
    args = hydra_private.args_parser().parse_args(
        ["-m", "--config-dir", "/tmp", "--config-name", "c", "a=1", "hydra.run.dir=x"])
    assert args.multirun and args.config_dir == "/tmp" and args.config_name == "c" and args.config_path is None
    assert args.overrides == ["a=1", "hydra.run.dir=x"] and args.shell_completion is False
    assert hydra_utils.get_args_parser is hydra_private.get_args_parser  # still where Hydra keeps it


def test_hydra_main_still_asks_get_mode_with_the_signature_replaced():
    # @hydra.main -> _run_hydra asks Hydra.get_mode(config_name=..., overrides=...) for the run mode.
    assert "hydra.get_mode(config_name=config_name, overrides=overrides)" in inspect.getsource(hydra_utils._run_hydra)
    assert list(inspect.signature(Hydra.get_mode).parameters) == ["self", "config_name", "overrides"]
    assert (list(inspect.signature(hydra_private._no_mode_from_configs).parameters)
            == list(inspect.signature(Hydra.get_mode).parameters))


def test_the_basic_plugins_targets_are_hydras_own():
    from hydra.core.config_store import ConfigStore
    from hydra.core.plugins import Plugins

    Plugins.instance()  # Hydra's core plugins store their configs
    store = ConfigStore.instance()
    assert store.load("hydra/launcher/basic.yaml").node._target_ == hydra_private.BASIC_LAUNCHER
    assert store.load("hydra/sweeper/basic.yaml").node._target_ == hydra_private.BASIC_SWEEPER


def test_no_other_module_imports_hydra_internals():
    users = []
    for path in [*(ROOT / "runners").rglob("*.py"), *(ROOT / "simcore").rglob("*.py"), *(ROOT / "hydra_plugins").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(name.startswith("hydra._internal") for name in names):
                users.append(path.relative_to(ROOT).as_posix())
    assert sorted(set(users)) == ["runners/hydra_private.py"]


def test_no_core_plugin_is_imported_before_hydras_plugin_scan():
    # The scan executes hydra._internal.core_plugins modules again: a class taken
    # from one earlier is not Hydra's (the sweeper's super() failed that way).
    import subprocess
    import sys

    code = ("import sys, runners.cli, runners.capacity, runners.callbacks; "
            "print([m for m in sys.modules if m.startswith('hydra._internal.core_plugins.')])")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
    sweeper = hydra_private.basic_sweeper()
    assert f"{sweeper.__module__}.{sweeper.__qualname__}" == hydra_private.BASIC_SWEEPER
