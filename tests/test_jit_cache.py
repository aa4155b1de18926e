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


def test_the_default_cache_is_a_private_directory_of_the_user(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    done = subprocess.run([sys.executable, "-c", "import simcore, numba; print(numba.config.CACHE_DIR)"],
                          env=env, capture_output=True, text=True, check=True)
    path = Path(done.stdout.strip())
    assert path == tmp_path / "cache" / "replaysim" / f"numba-{jit_cache.fingerprint()}"
    assert path.stat().st_mode & 0o777 == 0o700 and path.parent.stat().st_mode & 0o777 == 0o700
    assert done.stderr == ""


def test_a_cache_dir_others_can_write_is_warned_about(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    script = "import warnings; warnings.simplefilter('error'); import simcore"
    done = subprocess.run([sys.executable, "-c", script], env=dict(os.environ, NUMBA_CACHE_DIR=str(shared)),
                          capture_output=True, text=True)
    assert done.returncode == 1
    assert f"SharedCacheWarning: NUMBA_CACHE_DIR={shared}: {shared} is writable by others" in done.stderr
    shared.chmod(0o700)
    done = subprocess.run([sys.executable, "-c", script], env=dict(os.environ, NUMBA_CACHE_DIR=str(shared)),
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
