"""numba's cache directory follows the kernel sources (stale cross-module kernels never load)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numba

import simcore
from simcore import jit_cache

ROOT = Path(simcore.__file__).resolve().parent


def test_every_kernel_module_is_fingerprinted():
    modules = {path.relative_to(ROOT).as_posix() for path in jit_cache.kernel_modules()}
    with_kernels = {
        path.relative_to(ROOT).as_posix() for path in ROOT.rglob("*.py") if "@njit" in path.read_text()
    }
    assert with_kernels and with_kernels <= modules


def test_the_cache_directory_changes_with_any_kernel_module(tmp_path):
    copy = tmp_path / "simcore"
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns("__pycache__"))
    before = jit_cache.fingerprint(copy)
    assert before == jit_cache.fingerprint(ROOT)
    helper = copy / "scheduler" / "kv_nb.py"  # called by the engine kernel, another module
    helper.write_text(helper.read_text() + "\n# changed\n")
    changed = jit_cache.fingerprint(copy)
    assert changed != before
    (copy / "api.py").write_text((copy / "api.py").read_text() + "\n# not a kernel module\n")
    assert jit_cache.fingerprint(copy) == changed


def test_importing_simcore_points_numba_at_the_versioned_directory(tmp_path):
    assert numba.config.CACHE_DIR.endswith(jit_cache.fingerprint())
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path))
    done = subprocess.run(
        [sys.executable, "-c", "import simcore, numba; print(numba.config.CACHE_DIR)"],
        env=env, capture_output=True, text=True, check=True,
    )
    assert done.stdout.strip() == str(tmp_path / f"replaysim-{jit_cache.fingerprint()}")
