"""The quick subset: ``python3 -m pytest -q -m "not slow"`` (README.md, "Tests").

Marked ``slow`` here, so that the subset needs no edit when tests are added:

- every test of :data:`SLOW_MODULES`: they run the installed commands in
  subprocesses (Hydra, sweeps, launchers, the wheel, the README's commands);
- the tests of :data:`SLOW_TESTS`, which each run a whole scenario family
  to check what it covers;
- the cases of a seeded scenario family (a ``seed`` parameter) from seed
  :data:`QUICK_SEEDS` on: the subset keeps every family and every parameter
  combination, on its first seeds.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

#: Seeds of each scenario family that the quick subset keeps.
QUICK_SEEDS = 4

SLOW_MODULES = frozenset({
    "test_aiperf_export", "test_analyze", "test_calibrate", "test_capacity", "test_cli", "test_fuzz",
    "test_packaging", "test_readme", "test_reliability2_commands", "test_result_sets", "test_slurm", "test_sweep",
    "test_sweep_isolation",
})

SLOW_TESTS = frozenset({
    "test_prefix_pressure_scenarios_evict_and_block", "test_random_scenarios_hit_generated_blocks",
    "test_routing_scenarios_leave_round_robin", "test_offload_scenarios_cover_the_features",
})


def pytest_collection_modifyitems(config, items):
    slow = pytest.mark.slow
    for item in items:
        module = item.module.__name__.rsplit(".", 1)[-1]
        seed = getattr(getattr(item, "callspec", None), "params", {}).get("seed")
        if module in SLOW_MODULES or item.originalname in SLOW_TESTS or (isinstance(seed, int) and seed >= QUICK_SEEDS):
            item.add_marker(slow)


@pytest.fixture()
def tmpfs(tmp_path):
    """A mount point factory: a small tmpfs with the given options (root only), unmounted after the test."""
    mounted = []

    def mount(options: str) -> Path:
        where = tmp_path / f"mnt{len(mounted)}"
        where.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True)
        if done.returncode != 0:
            pytest.skip("cannot mount a tmpfs here (needs root)")
        mounted.append(where)
        return where

    yield mount
    for where in mounted:
        subprocess.run(["umount", str(where)], check=True)
