"""Stop a sweep's joblib workers when the launching process dies.

joblib's loky workers block on their task queue and never notice that the
process that launched them is gone (killed by SIGKILL, say): they would finish
their points and wait up to the idle timeout.  :func:`start` runs this module
as a small separate process, in its own session so that a terminal's Ctrl-C
does not end it first.  It polls the launcher's pid; once the launcher is gone
it sends SIGTERM to every process whose environment carries the launcher's
:data:`runners.cli.LAUNCHER_PID_ENV` (the workers inherit it; a worker stops
its point as on the command line, its temporary files removed), then SIGKILL
to those still alive after :data:`GRACE_S`.  The Slurm launcher's jobs are not
its business: they outlive their launcher by design.

Run as ``python -m runners.reaper <launcher pid>``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

#: The environment variable naming the launching process (set by :func:`runners.cli.main`).
LAUNCHER_PID_ENV = "REPLAYSIM_LAUNCHER_PID"
POLL_S = 0.2
GRACE_S = 2.0


def start(launcher_pid: int) -> subprocess.Popen:
    """Start the reaper of ``launcher_pid``'s workers (a child in its own session)."""
    return subprocess.Popen(
        [sys.executable, "-m", "runners.reaper", str(launcher_pid)],
        start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        env={**os.environ, LAUNCHER_PID_ENV: ""},  # not one of the processes it reaps
    )


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def workers_of(launcher_pid: int) -> list[int]:
    """Live processes whose environment names ``launcher_pid`` as their launcher (from ``/proc``)."""
    marker = f"{LAUNCHER_PID_ENV}={launcher_pid}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in (launcher_pid, os.getpid()):
            continue
        try:
            environment = (entry / "environ").read_bytes()
        except OSError:  # gone, or another user's
            continue
        if marker in environment.split(b"\0") and _alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def _signal_all(pids: list[int], signum: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except OSError:
            pass


def reap(launcher_pid: int) -> None:
    """Wait for ``launcher_pid`` to end, then stop its workers (SIGTERM, then SIGKILL)."""
    while _alive(launcher_pid):
        time.sleep(POLL_S)
    _signal_all(workers_of(launcher_pid), signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    while workers_of(launcher_pid) and time.monotonic() < deadline:
        time.sleep(POLL_S)
    _signal_all(workers_of(launcher_pid), signal.SIGKILL)


if __name__ == "__main__":
    reap(int(sys.argv[1]))
