"""Sweep jobs run in a forked child process, so that a point that crashes it fails alone.

A point can end its process without raising: a segfault or an abort in native
code, ``os._exit``, SIGKILL from the out-of-memory killer.  Run in the process
of the launcher (the basic launcher runs every job there, a joblib worker
many), it would end the sweep.  :class:`JobProcess` forks one child, which
runs the jobs it is sent one after another and stays up between them, so its
loaded numba kernels serve every later job and a job costs a message each way
instead of a fork.  When the child dies, :meth:`JobProcess.run` says how
(``killed by signal 11 (SIGSEGV)``), the caller records the job's unfinished
points as failed, and the next job gets a new child.

The launching process must not have started numba's parallel threads before
forking (a child would inherit their locks but not the threads): jobs with
batch axes (``simcore.run_batch``, a ``prange`` kernel) run only in the child.
The child dies with its parent (``PR_SET_PDEATHSIG`` on Linux; elsewhere it
exits when the parent's end of the pipe closes, after its job).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection, Pipe
from typing import Any, Callable

#: How long an interrupted parent waits for the child to stop by itself, then after forwarding the signal.
STOP_WAIT_S = 0.5
_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class ChildEnded:
    """How the child running a job ended before the job did."""

    pid: int
    #: ``killed by signal 11 (SIGSEGV)``, ``exited with code 3`` (:func:`exit_reason`).
    how: str


def _signal_of(exc: BaseException) -> int:
    """The signal behind an interruption: SIGTERM for ``runners.cli.Terminated`` (its ``signum``), else SIGINT."""
    return getattr(exc, "signum", signal.SIGINT)


def exit_reason(status: int) -> str:
    """``killed by signal 11 (SIGSEGV)`` or ``exited with code 3``, from a ``waitpid`` status."""
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        try:
            name = signal.Signals(number).name
        except ValueError:
            return f"killed by signal {number}"
        return f"killed by signal {number} ({name})"
    return f"exited with code {os.waitstatus_to_exitcode(status)}"


def _die_with_parent() -> None:
    """Ask Linux to send SIGTERM to this process when the thread that forked it ends."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _serve(conn: Connection, work: Callable[..., Any], parent: int) -> None:
    """The child's loop: run ``work(*job)`` for every job received, reply None or the exception."""
    _die_with_parent()
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(0)
    code = 0
    try:
        while True:
            try:
                job = conn.recv()
            except (EOFError, OSError):  # the parent is gone or done
                break
            try:
                work(*job)
                reply = None
            except Exception as exc:  # noqa: BLE001 - the parent raises it as the job's error
                reply = exc
            sys.stdout.flush()
            sys.stderr.flush()
            try:
                conn.send(reply)
            except Exception:  # noqa: BLE001 - an exception that does not pickle
                conn.send(RuntimeError(f"{type(reply).__name__}: {reply}"))
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM (runners.cli.Terminated): temporary files are gone
        code = 128 + _signal_of(exc)
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)  # no interpreter teardown: the parent's modules are not this process's to finalise


class JobProcess:
    """A forked child that runs ``work(*job)`` for each job, and says how it died if it does.

    Parameters
    ----------
    work : callable
        Run in the child with the arguments of each :meth:`run` call (they
        are pickled); its exceptions are raised again by :meth:`run`.
    """

    def __init__(self, work: Callable[..., Any]) -> None:
        self.work = work
        self.pid: int | None = None
        self.conn: Connection | None = None

    def _start(self) -> None:
        parent_end, child_end = Pipe()
        sys.stdout.flush()  # else the child would print the parent's buffered lines again
        sys.stderr.flush()
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:
            parent_end.close()
            _serve(child_end, self.work, parent)
        child_end.close()
        self.pid, self.conn = pid, parent_end

    def run(self, *job: Any) -> ChildEnded | None:
        """Run one job in the child (started if need be).

        Returns
        -------
        ChildEnded or None
            None when the job ran; else the child's pid and how it ended:
            the job did not finish.

        Raises
        ------
        Exception
            The job's own exception, raised in the child.
        KeyboardInterrupt
            Ctrl-C or SIGTERM in this process: the child is stopped first.
        """
        if self.pid is not None and os.waitpid(self.pid, os.WNOHANG)[0]:  # died between jobs: not this job's doing
            self.conn.close()
            self.pid = self.conn = None
        if self.pid is None:
            self._start()
        try:
            self.conn.send(job)
            reply = self.conn.recv()
        except (EOFError, OSError):
            return self._reap()
        except BaseException as exc:
            self.stop(_signal_of(exc))
            raise
        if reply is not None:
            raise reply
        return None

    def _reap(self) -> ChildEnded:
        pid = self.pid
        _, status = os.waitpid(pid, 0)
        self.conn.close()
        self.pid = self.conn = None
        return ChildEnded(pid, exit_reason(status))

    def _wait(self, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while True:
            done, _ = os.waitpid(self.pid, os.WNOHANG)
            if done or time.monotonic() >= deadline:
                return bool(done)
            time.sleep(0.01)

    def close(self) -> None:
        """End the child between jobs: it exits when its end of the pipe closes; reap it."""
        if self.pid is None:
            return
        self.conn.close()
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass
        self.pid = self.conn = None

    def stop(self, signum: int = signal.SIGTERM) -> None:
        """End the child: let it stop by itself (a Ctrl-C reaches it too), then ``signum``, then SIGKILL."""
        if self.pid is None:
            return
        try:
            if not self._wait(STOP_WAIT_S):
                os.kill(self.pid, signum)
                if not self._wait(STOP_WAIT_S):
                    os.kill(self.pid, signal.SIGKILL)
                    os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass
        self.conn.close()
        self.pid = self.conn = None
