"""Every key is documented where it is declared, and the generated help and docs/options.md are current."""

from __future__ import annotations

import subprocess
import sys

import pytest

from runners import options
from simcore.checks import describe
from simcore.config import DEFAULTS
from simcore.settings import SimConfig


def leaves(tree: dict, prefix: str = "") -> set[str]:
    found = set()
    for name, value in tree.items():
        if isinstance(value, dict) and value:
            found |= leaves(value, f"{prefix}{name}.")
        else:
            found.add(f"{prefix}{name}")
    return found


def test_every_key_of_the_default_tree_is_described():
    described = {doc.path: doc for doc in describe(SimConfig)}
    # a key whose value is a mapping (engine.router.weights) is described once, with its fields
    covered = {leaf for leaf in leaves(DEFAULTS) if not any(leaf.startswith(f"{path}.") for path in described)}
    assert set(described) == covered | {path for path, doc in described.items() if isinstance(doc.default, dict)}
    undocumented = sorted(path for path, doc in described.items() if not doc.doc.strip())
    assert undocumented == [], f"keys without a description: {undocumented}"
    unbounded = sorted(path for path, doc in described.items() if not doc.values.strip())
    assert unbounded == [], f"keys without their allowed values: {unbounded}"


def test_runner_and_capacity_keys_are_described():
    from runners.capacity import CAPACITY_DEFAULTS
    from runners.sweep import RUNNER_DEFAULTS

    runner = {option.key for option in options.runner_options()}
    assert runner == (leaves(RUNNER_DEFAULTS) - {"sweep.batch"}) | {"sweep.batch.<key>"}
    capacity = {option.key.split(".", 1)[1] for option in options.capacity_options()}
    assert capacity == (leaves(CAPACITY_DEFAULTS) - {"slo"}) | {"slo.<metric>"}
    assert all(option.doc and option.values for option in options.runner_options() + options.capacity_options())


def test_units_follow_the_names():
    units = {doc.path: doc.unit for doc in describe(SimConfig)}
    assert units["load.think_time_ms"] == "ms"
    assert units["timing.per_prefill_token_us"] == "µs"
    assert units["timing.per_kv_token_ns"] == "ns"
    assert units["engine.kv_transfer.bandwidth_gb_per_second"] == "GB/s"
    assert units["workload.input_tokens"] == "tokens"
    assert units["metrics.goodput.ttft_ms"] == "ms"
    assert units["engine.aggregated.num_blocks"] == "blocks"  # declared, the name says none


@pytest.mark.parametrize("path", sorted(options.generated(), key=str))
def test_generated_files_are_current(path):
    expected = options.generated()[path]
    assert path.is_file() and path.read_text(encoding="utf-8") == expected, (
        f"{path.name} is stale: run python -m runners.options --write"
    )


def test_help_groups_every_key_and_lists_the_commands():
    text = options.help_text()
    for option in options.simulation_options() + options.runner_options():
        assert f"  {option.key} (" in text, option.key
    assert "capacity.tolerance" not in text and "capacity.tolerance" in options.help_text("replaysim-capacity")
    for command, _ in options.COMMANDS:
        assert f"  {command} " in text
    assert max(len(line) for line in text.splitlines()) <= 100


@pytest.mark.parametrize("module,command", [("runners.cli", "replaysim"), ("runners.capacity", "replaysim-capacity")])
def test_help_flag_prints_the_written_help(module, command):
    done = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == options.HELP_FILES[command].read_text(encoding="utf-8")


def test_the_console_entry_answers_help_without_hydra_or_the_kernels():
    code = ("import sys; sys.argv = ['replaysim', '--help']; from runners import entry; entry.replaysim(); "
            "assert 'hydra' not in sys.modules and 'numba' not in sys.modules and 'simcore' not in sys.modules")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == options.HELP_FILES["replaysim"].read_text(encoding="utf-8")
