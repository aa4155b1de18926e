"""A point that ends its process (segfault, SIGKILL, os._exit) is a failed point; the sweep goes on.

The fault is injected by a ``sitecustomize`` module put on ``PYTHONPATH`` for
the sweep only (so that joblib's workers, fresh interpreters, get it too): it
wraps :func:`runners.sweep.write_results` so that writing the point whose
directory is named ``$CRASH_POINT`` ends the process as ``$CRASH_HOW`` says.
Nothing of it is in replaysim's own code or configs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["workload.num_requests=8", "workload.input_tokens=64", "workload.output_tokens=4"]
HOOK = '''
import os, signal
import runners.sweep as sweep

_write_results = sweep.write_results


def write_results(result, out, **kwargs):
    if out.name == os.environ["CRASH_POINT"]:
        how = os.environ["CRASH_HOW"]
        if how == "exit":
            os._exit(3)
        os.kill(os.getpid(), getattr(signal, how))
    return _write_results(result, out, **kwargs)


sweep.write_results = write_results
'''


def crashing_sweep(tmp_path: Path, point: str, how: str, *args: str) -> subprocess.CompletedProcess:
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(HOOK)
    env = {**os.environ, "CRASH_POINT": point, "CRASH_HOW": how,
           "PYTHONPATH": os.pathsep.join([str(hook), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "runners.cli", "-m", f"hydra.sweep.dir={tmp_path / 'sweep'}", *args],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def check_one_point_failed(done: subprocess.CompletedProcess, root: Path, lost: str, how: str, total: int) -> None:
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines()[-1] == (
        "replaysim: error: 1 point of the sweep failed (summary.parquet lists them)")
    table = pl.read_parquet(root / "summary.parquet")
    assert table.height == total
    failed = table.filter(pl.col("status") == "failed")
    assert failed["path"].to_list() == [lost]
    assert table.filter(pl.col("status") == "ok").height == total - 1
    failure = json.loads((root / lost / "failure.json").read_text())
    assert failure["error_type"] == "PointLost"
    assert failure["error"].endswith(f"ended before the point finished: {how}")
    assert not (root / lost / "requests.parquet").exists()
    for other in table.filter(pl.col("status") == "ok")["path"]:
        assert (root / other / "manifest.json").exists()


@pytest.mark.parametrize("how, reason", [
    ("SIGSEGV", "killed by signal 11 (SIGSEGV)"),
    ("SIGKILL", "killed by signal 9 (SIGKILL)"),  # as the out-of-memory killer does
    ("SIGABRT", "killed by signal 6 (SIGABRT)"),
    ("exit", "exited with code 3"),
])
def test_a_crashing_point_fails_alone_with_the_basic_launcher(tmp_path, how, reason):
    done = crashing_sweep(tmp_path, "1", how, "load.concurrency=1,2,3", *SMALL)
    check_one_point_failed(done, tmp_path / "sweep", "1", reason, total=3)


def test_a_crashing_point_fails_alone_with_the_joblib_launcher(tmp_path):
    done = crashing_sweep(tmp_path, "2", "SIGSEGV", "hydra/launcher=local", "hydra.launcher.n_jobs=2",
                          "load.concurrency=1,2,3,4", *SMALL)
    check_one_point_failed(done, tmp_path / "sweep", "2", "killed by signal 11 (SIGSEGV)", total=4)


def test_a_crash_among_batch_points_fails_the_unfinished_ones(tmp_path):
    """Batch axes in a multirun: the points written before the crash keep their results, the rest fail."""
    done = crashing_sweep(tmp_path, "point-001", "SIGSEGV", "load.concurrency=1,2",
                          "sweep.batch.seed=[0,1,2]", *SMALL)
    assert done.returncode == 1, done.stderr
    table = pl.read_parquet(tmp_path / "sweep" / "summary.parquet")
    status = dict(zip(table["path"], table["status"]))
    # every job crashes at its second point: its first point is done, the second and third are lost
    assert status == {f"{job}/point-{i:03d}": "ok" if i == 0 else "failed" for job in (0, 1) for i in range(3)}
    assert done.stderr.splitlines()[-1].startswith("replaysim: error: 4 points of the sweep failed")


def test_a_rerun_after_a_crash_runs_only_the_failed_point(tmp_path):
    first = crashing_sweep(tmp_path, "0", "SIGSEGV", "load.concurrency=1,2", *SMALL)
    assert first.returncode == 1, first.stderr
    rerun = subprocess.run([sys.executable, "-m", "runners.cli", "-m", f"hydra.sweep.dir={tmp_path / 'sweep'}",
                            "load.concurrency=1,2", *SMALL], cwd=tmp_path, capture_output=True, text=True,
                           timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert rerun.returncode == 0, rerun.stderr
    table = pl.read_parquet(tmp_path / "sweep" / "summary.parquet")
    assert table["status"].to_list() == ["ok", "skipped"]


def test_exit_reasons_name_the_signal():
    from runners.isolate import exit_reason

    assert exit_reason(signal.SIGSEGV) == "killed by signal 11 (SIGSEGV)"  # a waitpid status: signal in the low bits
    assert exit_reason(3 << 8) == "exited with code 3"


def test_hydra_mode_is_read_from_configs_only_when_one_may_set_it():
    """runners.cli skips Hydra's extra composition for hydra.mode only when no config can set it."""
    from omegaconf import OmegaConf

    from runners.cli import CONFIG_DIR, mode_only_from_command_line
    from runners.hydra_private import args_parser

    def skips(*argv: str) -> bool:
        return mode_only_from_command_line(args_parser().parse_args(list(argv)))

    assert skips("load.concurrency=4") and skips("-m", "load.concurrency=1,2", "hydra/launcher=local")
    assert not skips("hydra.mode=MULTIRUN", "load.concurrency=1,2")
    assert not skips("--config-dir", "/tmp", "load.concurrency=4")
    assert not skips("--config-name", "other")
    assert not skips("hydra.searchpath=[file:///tmp]")
    for path in CONFIG_DIR.rglob("*.yaml"):  # the shipped configs and presets
        assert OmegaConf.select(OmegaConf.load(path), "hydra.mode") is None, path
