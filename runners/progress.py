"""Progress of a run or a sweep: tqdm on a terminal, a start and an end line elsewhere.

``RunProgress`` follows one simulation through its phases: preparing the
workload and the kernel's inputs, or compiling kernels (shown instead when
numba's cache holds no compiled engine kernel, see
:func:`simcore.jit_cache.engine_kernel_cached`), simulating (a tqdm bar of the
requests finished, on stderr; its rate and ETA restart when the kernel starts,
so compilation does not skew them), computing metrics (once every request
finished) and writing results.  A background thread
redraws the bar while the main thread is busy in numba or pyarrow, so its
clock keeps running.  tqdm sizes the line to the terminal at every redraw
(``dynamic_ncols``) and trims it to the width, so a narrow terminal never gets
a wrapped, stale line.  Off a terminal it prints one start line and one end
line on stdout (stderr stays clean for the one-line error of SPEC §11).

``LineProgress`` reports points of a sweep or of in-job batch axes.  Sweep
jobs and Hydra log whole lines to the same terminal, from this process or from
joblib workers, so an in-place bar would be overwritten; instead, on a
terminal, a tqdm-formatted status line (``sweep  35%|███▌   | 7/20
[00:05<00:09, 1.4 point/s]``) is printed as one write when points finished, at
most every :data:`STATUS_EVERY_S`.  ``SweepWatcher`` drives one from a
background thread by counting the ``point.json`` files a sweep writes, so it
works the same for the basic launcher, joblib workers and submitit jobs.
"""

from __future__ import annotations

import shutil
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, TextIO


if TYPE_CHECKING:
    from tqdm import tqdm

    from runners.compile_watch import CompileWatch
from simcore.jit_cache import engine_kernel_cached

#: Seconds between redraws of the run bar by its background thread.
REDRAW_S = 0.25
#: A run bar appears only for runs longer than this (a cold start shows at once).
BAR_DELAY_S = 0.5
#: The line before the kernel runs (workload, kernel inputs, numba compiling):
#: no count or rate yet, only the clock.  In both formats the figures come
#: first, so a narrow terminal trims the bar.
WAITING_FORMAT = "{elapsed} {desc}"
RUNNING_FORMAT = "{percentage:3.0f}% {n_fmt}/{total_fmt} [{elapsed}<{remaining}] {desc} |{bar}|"
#: From this many requests on, counts are shown as 12.3k (a narrow terminal keeps them).
SCALE_FROM = 10_000
#: At most one sweep status line per this many seconds.
STATUS_EVERY_S = 2.0


def interactive(stream: TextIO | None = None) -> bool:
    """True when stdout and ``stream`` (default stderr) are both terminals."""
    stream = sys.stderr if stream is None else stream
    try:
        return sys.stdout.isatty() and stream.isatty()
    except (AttributeError, ValueError):
        return False


def _say(line: str, stream: TextIO) -> None:
    stream.write(line + "\n")
    stream.flush()


def announce_compile(stream: TextIO | None = None) -> bool:
    """Say ``compiling kernels (first run only)`` (default on stdout) when the cache is cold.

    For sweeps and batches, whose first point compiles before any status line.

    Returns
    -------
    bool
        True when the line was printed.
    """
    if engine_kernel_cached():
        return False
    _say("replaysim: compiling kernels (first run only)", sys.stdout if stream is None else stream)
    return True


class RunProgress:
    """Progress of one simulation: compiling, simulating, writing results.

    Parameters
    ----------
    cold : bool
        numba has no compiled engine kernel cached: the first dispatch compiles.
    watch : CompileWatch, optional
        Counts the compilations (opened and closed here); while compiling, the
        bar shows its :meth:`~runners.compile_watch.CompileWatch.describe`.
    enabled : bool, optional
        Draw the bar; default :func:`interactive` for stderr.
    bar_stream, line_stream : file, optional
        Where the bar (default stderr) and the start and end lines (default
        stdout) go.
    """

    def __init__(self, cold: bool, enabled: bool | None = None,
                 bar_stream: TextIO | None = None, line_stream: TextIO | None = None,
                 watch: CompileWatch | None = None):
        self.bar_stream = sys.stderr if bar_stream is None else bar_stream
        self.line_stream = sys.stdout if line_stream is None else line_stream
        self.enabled = interactive(self.bar_stream) if enabled is None else enabled
        self.start = time.monotonic()
        self.simulated_at: float | None = None
        self.compiled_at: float | None = None
        self.total: int | None = None
        self.compiling = cold
        self.watch = watch.__enter__() if watch is not None and cold else None
        self.bar: tqdm | None = None
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        self._closed = False
        if not self.enabled:
            _say(f"replaysim: simulating{'; compiling kernels (first run only)' if cold else ''}", self.line_stream)
            return
        from tqdm import tqdm  # only for a bar on a terminal

        self.bar = tqdm(
            total=None, desc="compiling kernels (first run only)" if cold else "preparing",
            unit="req", file=self.bar_stream, dynamic_ncols=True, leave=False,
            delay=0 if cold else BAR_DELAY_S, mininterval=REDRAW_S, bar_format=WAITING_FORMAT,
        )
        self._ticker = threading.Thread(target=self._tick, name="replaysim-progress", daemon=True)
        self._ticker.start()

    def _tick(self) -> None:
        while not self._stop.wait(REDRAW_S):
            if self.compiling and self.watch is not None:
                self.bar.set_description_str(self.watch.describe(), refresh=False)
            if time.monotonic() - self.start >= self.bar.delay:
                self.bar.refresh()

    def update(self, done: int, total: int) -> None:
        """``simcore.run``'s progress callback: requests finished out of ``total``."""
        self.total = total
        if self.compiling and done == 0:
            return
        started = self.compiling
        if started:  # the first request finished: the kernel runs
            self.compiling = False
            self.compiled_at = time.monotonic()
            if self.watch is not None:
                self.watch.__exit__(None, None, None)
        if self.bar is None:
            return
        # The kernel started, or a repeated run (bounded mode) counts from 0 again.
        if started or self.bar.total != total or done < self.bar.n:
            self.bar.bar_format = RUNNING_FORMAT
            self.bar.set_description_str("simulating", refresh=False)
            self.bar.unit_scale = total >= SCALE_FROM
            self.bar.reset(total=total)  # rate and ETA from the kernel's own start
        self.bar.update(done - self.bar.n)
        if done == total:  # the kernel is over; simcore builds the tables and the summary
            self.bar.set_description_str("computing metrics")

    def writing(self) -> None:
        """The simulation is over; the result files are being written."""
        self.simulated_at = time.monotonic()
        if self.bar is not None:
            self.bar.set_description_str("writing results", refresh=False)
            self.bar.refresh()

    def __enter__(self) -> "RunProgress":
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        self.close(ok=exc_type is None)

    def close(self, ok: bool = True) -> None:
        """Stop drawing and clear the bar; after a finished run print the end line (once)."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
        if self.watch is not None:
            self.watch.__exit__(None, None, None)
        if self.bar is not None:
            self.bar.close()
        if not ok:
            return
        now = time.monotonic()
        simulated = (self.simulated_at or now) - self.start
        requests = "" if self.total is None else f"{self.total} requests "
        kernels = "kernels" if self.watch is None else f"{self.watch.done} kernels"
        compiled = "" if self.compiled_at is None else f" ({kernels} compiled in {self.compiled_at - self.start:.2f} s)"
        _say(f"replaysim: {requests}simulated in {simulated:.2f} s{compiled}, results written in "
             f"{now - (self.simulated_at or now):.2f} s", self.line_stream)


class LineProgress:
    """Points done out of a total, as whole lines (see the module docstring).

    Parameters
    ----------
    total : int or None
        Expected points; None counts without percentage or ETA.
    label : str
        ``sweep`` or ``batch``.
    stream : file, optional
        Default stdout, where the points' own lines go.
    enabled : bool, optional
        Status lines while running; default :func:`interactive` for stdout.
        Either way a start line and an end line are printed.
    """

    def __init__(self, total: int | None, label: str, stream: TextIO | None = None,
                 enabled: bool | None = None):
        self.total = total
        self.label = label
        self.stream = sys.stdout if stream is None else stream
        self.enabled = interactive(self.stream) if enabled is None else enabled
        self.done = 0
        self.start = time.monotonic()
        self._printed = (0, self.start)
        _say(f"{label}: {'?' if total is None else total} points", self.stream)

    def line(self) -> str:
        """The status line: tqdm's meter, trimmed to the terminal width."""
        from tqdm import tqdm  # only for a status line on a terminal

        width = shutil.get_terminal_size((80, 24)).columns - 1
        return tqdm.format_meter(self.done, self.total, time.monotonic() - self.start,
                                 ncols=width, prefix=self.label, unit="point")

    def update(self, done: int | None = None) -> None:
        """Set (or advance by one) the points done; print a status line if due."""
        self.done = self.done + 1 if done is None else done
        count, at = self._printed
        now = time.monotonic()
        if self.enabled and self.done != count and now - at >= STATUS_EVERY_S:
            self._printed = (self.done, now)
            _say(self.line(), self.stream)

    def close(self) -> None:
        """Print the end line."""
        seconds = time.monotonic() - self.start
        of = "" if self.total is None else f"/{self.total}"
        _say(f"{self.label}: {self.done}{of} points done in {seconds:.2f} s", self.stream)


class SweepWatcher:
    """Counts finished sweep points under a directory and reports a :class:`LineProgress`.

    Parameters
    ----------
    root : Path
        The sweep directory (may not exist yet).
    total : int or None
        Expected number of points.
    marker : str
        File name each finished point (re)writes (``point.json``).
    enabled : bool, optional
        Status lines while running; default :func:`interactive`.
    """

    def __init__(self, root: Path, total: int | None, marker: str, enabled: bool | None = None):
        self.root = Path(root)
        self.marker = marker
        self._before = self._scan()
        self.progress = LineProgress(total, "sweep", enabled=enabled)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _scan(self) -> dict[Path, int]:
        if not self.root.exists():
            return {}
        out = {}
        for path in self.root.rglob(self.marker):
            try:
                out[path] = path.stat().st_mtime_ns
            except OSError:
                continue
        return out

    def count(self) -> int:
        """Points finished since the watcher started (new or rewritten markers)."""
        now = self._scan()
        return sum(1 for path, mtime in now.items() if self._before.get(path) != mtime)

    def start(self) -> None:
        """Start polling (only when status lines are printed)."""
        if not self.progress.enabled:
            return
        self._thread = threading.Thread(target=self._run, name="replaysim-progress", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        interval = 0.5
        while not self._stop.wait(interval):
            start = time.monotonic()
            self.progress.update(self.count())
            # Large sweeps: keep directory scans under ~10% of the time.
            interval = max(0.5, 10 * (time.monotonic() - start))

    def stop(self) -> None:
        """Stop polling and print the end line with the final count."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.progress.done = self.count()
        self.progress.close()
