"""``hydra/launcher=slurm`` on a real Slurm cluster (``.ci/slurm-up.sh`` starts one on this machine).

Skipped when ``sinfo`` is absent or no node is up.  A 4-point sweep runs as a
Slurm job array; a second sweep loses one job to ``scancel``, which must be
recorded as a failed point, and a rerun into the same sweep directory must
complete it.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest

REPO = Path(__file__).resolve().parents[1]
NUM_REQUESTS = 16
CONCURRENCIES = (1, 2, 3, 4)
UP_STATES = {"idle", "mixed", "allocated", "completing"}


def _nodes_up() -> bool:
    try:
        states = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    return any(state.strip().rstrip("*~#") in UP_STATES for state in states.split())


pytestmark = [
    pytest.mark.skipif(shutil.which("sinfo") is None, reason="no Slurm client (sinfo); start one with .ci/slurm-up.sh"),
    pytest.mark.skipif(shutil.which("sinfo") is not None and not _nodes_up(),
                       reason="no Slurm node is up (sinfo); start one with .ci/slurm-up.sh"),
]


def sweep_command(sweep: Path, name: str, *extra: str) -> list[str]:
    """A 4-point concurrency sweep of small runs through the Slurm preset, as a user types it."""
    return [
        sys.executable, "-m", "runners.cli", "-m", "hydra/launcher=slurm",
        "load.concurrency=" + ",".join(map(str, CONCURRENCIES)),
        f"workload.num_requests={NUM_REQUESTS}", "workload.input_tokens=64", "workload.output_tokens=8",
        "export.detailed=false", f"hydra.sweep.dir={sweep}", f"hydra.launcher.name={name}", *extra,
    ]


def environment() -> dict[str, str]:
    # sbatch exports the launching environment: the jobs import this checkout too
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    return env


def summary(sweep: Path) -> pl.DataFrame:
    return pl.read_parquet(sweep / "summary.parquet").sort("load.concurrency")


def job_states(name: str) -> dict[str, str]:
    """Array task id -> Slurm state of the jobs named ``name``, from accounting (sacct)."""
    out = subprocess.run(["sacct", "-n", "-X", "-P", "--name", name, "-o", "JobID,State"],
                         capture_output=True, text=True, timeout=30).stdout
    return dict(line.split("|", 1) for line in out.splitlines() if line)


def test_a_sweep_runs_as_slurm_array_tasks(tmp_path):
    name = f"replaysim-test-{uuid.uuid4().hex[:8]}"
    sweep = tmp_path / "first"
    done = subprocess.run(sweep_command(sweep, name), cwd=tmp_path, env=environment(),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    table = summary(sweep)
    assert table["status"].to_list() == ["ok"] * 4
    assert table["load.concurrency"].to_list() == list(CONCURRENCIES)
    assert table["completed"].to_list() == [NUM_REQUESTS] * 4
    for row in table.iter_rows(named=True):
        point = sweep / row["path"]
        requests = pl.read_parquet(point / "requests.parquet")
        assert requests.height == NUM_REQUESTS
        assert requests["run_id"].unique().to_list() == [row["run_id"]]
        assert requests["load.concurrency"].unique().to_list() == [row["load.concurrency"]]
        # the summary row is the point's summary.json, gathered after the jobs returned
        own = json.loads((point / "summary.json").read_text())
        assert row["p99_ttft_ms"] == own["p99_ttft_ms"] and row["mean_e2el_ms"] == own["mean_e2el_ms"]
        # each point ran in a Slurm job of this sweep on this machine's node, not in the launching process
        runtime = json.loads((point / "point.json").read_text())["runtime"]
        assert runtime["host"] == socket.gethostname() and runtime["pid"] != os.getpid()
    states = job_states(name)
    assert sorted(states.values()) == ["COMPLETED"] * 4, states
    assert {job.split("_")[1] for job in states} == {"0", "1", "2", "3"}


def test_a_cancelled_job_is_a_failed_point_and_a_rerun_completes_it(tmp_path):
    name = f"replaysim-test-{uuid.uuid4().hex[:8]}"
    sweep = tmp_path / "cancel"
    # The last array task waits before starting Python, so scancel reliably finds
    # it running and kills it before it writes anything (a job lost mid-run).
    hold = "hydra.launcher.setup=['test \"$SLURM_ARRAY_TASK_ID\" != 3 || sleep 600']"
    launched = subprocess.Popen(sweep_command(sweep, name, hold), cwd=tmp_path, env=environment(),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while True:
            queued = subprocess.run(["squeue", "-h", "-r", "-n", name, "-o", "%i %t"],
                                    capture_output=True, text=True, timeout=30).stdout.split("\n")
            running = [line.split()[0] for line in queued if line.endswith(" R") and line.split()[0].endswith("_3")]
            if running:
                break
            assert launched.poll() is None and time.monotonic() < deadline, "task 3 never ran"
            time.sleep(0.5)
        subprocess.run(["scancel", running[0]], check=True, timeout=30)
        stdout, stderr = launched.communicate(timeout=600)
    finally:
        if launched.poll() is None:
            launched.kill()
            subprocess.run(["scancel", "-n", name], timeout=30)
    assert launched.returncode == 0, stderr[-3000:]
    table = summary(sweep)
    assert table["status"].to_list() == ["ok", "ok", "ok", "failed"]
    lost = table.row(3, named=True)
    assert lost["error_type"] == "UncompletedJobError" and "CANCELLED" in lost["error"]
    assert lost["completed"] is None and lost["run_id"] == f"{sweep.name}/3"
    failure = json.loads((sweep / "3" / "failure.json").read_text())
    assert failure["error_type"] == "UncompletedJobError" and failure["run_id"] == lost["run_id"]
    assert not (sweep / "3" / "requests.parquet").exists()
    assert json.loads(pq.read_schema(sweep / "summary.parquet").metadata[b"failed"]) == [lost["run_id"]]
    assert job_states(name)[running[0]].startswith("CANCELLED")

    # Resume: the same command into the same directory runs only the lost point.
    again = subprocess.run(sweep_command(sweep, name), cwd=tmp_path, env=environment(),
                           capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    table = summary(sweep)
    assert table["status"].to_list() == ["skipped", "skipped", "skipped", "ok"]
    assert table["completed"].to_list() == [NUM_REQUESTS] * 4
    assert not (sweep / "3" / "failure.json").exists()
    assert pl.read_parquet(sweep / "3" / "requests.parquet").height == NUM_REQUESTS
