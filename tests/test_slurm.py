"""``hydra/launcher=slurm`` on a real Slurm cluster (``.ci/slurm-up.sh`` starts one on this machine).

Skipped when ``sinfo`` is absent or no node is up.  A 4-point sweep runs as a
Slurm job array; a second sweep loses two jobs to ``scancel`` (one running, one
pending), which must be recorded as failed points, and a rerun into the same
sweep directory must complete them.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest

from tests.slurm_cluster import nodes_up

REPO = Path(__file__).resolve().parents[1]
NUM_REQUESTS = 16
CONCURRENCIES = (1, 2, 3, 4)


pytestmark = [
    pytest.mark.skipif(shutil.which("sinfo") is None, reason="no Slurm client (sinfo); start one with .ci/slurm-up.sh"),
    pytest.mark.skipif(shutil.which("sinfo") is not None and not nodes_up(),
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


def job_states(name: str, count: int = 1, settle_s: float = 30.0) -> dict[str, str]:
    """Array task id -> Slurm state of the jobs named ``name``, from accounting (sacct).

    slurmdbd records a job's end shortly after the job is gone, so this waits
    (at most ``settle_s``) until ``count`` jobs are listed, none of them still
    pending or running.
    """
    deadline = time.monotonic() + settle_s
    while True:
        out = subprocess.run(["sacct", "-n", "-X", "-P", "--name", name, "-o", "JobID,State"],
                             capture_output=True, text=True, timeout=30).stdout
        states = dict(line.split("|", 1) for line in out.splitlines() if line)
        settled = len(states) >= count and not {"PENDING", "RUNNING"} & set(states.values())
        if settled or time.monotonic() > deadline:
            return states
        time.sleep(0.5)


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
    states = job_states(name, count=4)
    assert sorted(states.values()) == ["COMPLETED"] * 4, states
    assert {job.split("_")[1] for job in states} == {"0", "1", "2", "3"}


def test_cancelled_jobs_are_failed_points_and_a_rerun_completes_them(tmp_path):
    name = f"replaysim-test-{uuid.uuid4().hex[:8]}"
    sweep = tmp_path / "cancel"
    release = tmp_path / "release"
    # Two array tasks at a time; tasks 0 and 1 hold before starting Python until
    # `release` exists, so task 1 is cancelled while running (before it writes
    # anything) and task 3 while pending (it never starts), then 0 and 2 run.
    hold = (f"hydra.launcher.setup=['test \"$SLURM_ARRAY_TASK_ID\" -gt 1 || "
            f"while test ! -e {release}; do sleep 0.2; done']")
    command = sweep_command(sweep, name, hold, "hydra.launcher.array_parallelism=2")
    launched = subprocess.Popen(command, cwd=tmp_path, env=environment(),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while True:
            listed = subprocess.run(["squeue", "-h", "-r", "-n", name, "-o", "%i %t"],
                                    capture_output=True, text=True, timeout=30).stdout
            states = dict(line.split() for line in listed.splitlines() if line.strip())
            task = {job.rsplit("_", 1)[1]: job for job in states}
            if states.get(task.get("1")) == "R" and states.get(task.get("3")) == "PD":
                break
            assert launched.poll() is None and time.monotonic() < deadline, listed
            time.sleep(0.5)
        subprocess.run(["scancel", task["1"], task["3"]], check=True, timeout=30)
        release.touch()
        _, stderr = launched.communicate(timeout=600)
    finally:
        release.touch()
        if launched.poll() is None:
            launched.kill()
            subprocess.run(["scancel", "-n", name], timeout=30)
    assert launched.returncode == 1, stderr[-3000:]  # two points failed
    assert stderr.splitlines()[-1] == "replaysim: error: 2 points of the sweep failed (summary.parquet lists them)"
    table = summary(sweep)
    assert table["status"].to_list() == ["ok", "failed", "ok", "failed"]
    assert table["completed"].to_list() == [NUM_REQUESTS, None, NUM_REQUESTS, None]
    running, pending = table.row(1, named=True), table.row(3, named=True)
    assert running["error_type"] == pending["error_type"] == "UncompletedJobError"
    assert "CANCELLED" in running["error"] and "cancelled while pending" in pending["error"]
    for row in (running, pending):
        failure = json.loads((sweep / row["path"] / "failure.json").read_text())
        assert failure["run_id"] == row["run_id"] and failure["error_type"] == "UncompletedJobError"
        assert not (sweep / row["path"] / "requests.parquet").exists()
    assert json.loads(pq.read_schema(sweep / "summary.parquet").metadata[b"failed"]) == [
        running["run_id"], pending["run_id"]
    ]
    assert job_states(name)[task["1"]].startswith("CANCELLED")

    # Resume: the same command into the same directory runs only the lost points.
    again = subprocess.run(sweep_command(sweep, name), cwd=tmp_path, env=environment(),
                           capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    table = summary(sweep)
    assert table["status"].to_list() == ["skipped", "ok", "skipped", "ok"]
    assert table["completed"].to_list() == [NUM_REQUESTS] * 4
    for job in ("1", "3"):
        assert not (sweep / job / "failure.json").exists()
        assert pl.read_parquet(sweep / job / "requests.parquet").height == NUM_REQUESTS


def test_sigterm_to_the_launcher_cancels_its_array_tasks(tmp_path):
    name = f"replaysim-test-{uuid.uuid4().hex[:8]}"
    never = tmp_path / "never"  # never created: every task holds in its setup line until cancelled
    hold = f"hydra.launcher.setup=['while test ! -e {never}; do sleep 0.2; done']"
    command = sweep_command(tmp_path / "stopped", name, hold, "hydra.launcher.array_parallelism=2")
    launched = subprocess.Popen(command, cwd=tmp_path, env=environment(),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while True:  # two tasks running, two pending
            listed = subprocess.run(["squeue", "-h", "-r", "-n", name, "-o", "%t"],
                                    capture_output=True, text=True, timeout=30).stdout.split()
            if sorted(listed) == ["PD", "PD", "R", "R"]:
                break
            assert launched.poll() is None and time.monotonic() < deadline, listed
            time.sleep(0.5)
        launched.send_signal(signal.SIGTERM)
        _, stderr = launched.communicate(timeout=60)
        assert launched.returncode == 143, stderr[-3000:]
        assert stderr.splitlines()[-1] == "replaysim: stopped by SIGTERM; results of unfinished runs were not written"
        # only the launcher cancelled them: nothing else here does before these checks
        deadline = time.monotonic() + 60
        while subprocess.run(["squeue", "-h", "-r", "-n", name, "-o", "%i"],
                             capture_output=True, text=True, timeout=30).stdout.strip():
            assert time.monotonic() < deadline, "array tasks still queued after the launcher stopped"
            time.sleep(0.5)
        # the running tasks are accounted as cancelled (pending ones may leave no record)
        states = job_states(name, count=2)
        assert len(states) >= 2 and all(state.startswith("CANCELLED") for state in states.values()), states
    finally:
        if launched.poll() is None:
            launched.kill()
        subprocess.run(["scancel", "-n", name], timeout=30)
