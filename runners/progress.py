"""A small progress bar with ETA, drawn only on a terminal.

``Progress`` draws ``label [#####.....] 5/20 25% 0:04 elapsed ETA 0:12`` on
stderr when both stdout and stderr are terminals, and nothing otherwise (logs,
CI, pipes).  ``SweepWatcher`` drives one from a background thread by counting
the ``point.json`` files a sweep writes, so it works the same whether the
points run in this process (basic launcher), in joblib workers or in submitit
jobs on a shared file system.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import TextIO

WIDTH = 24
REDRAW_S = 0.2


def interactive(stream: TextIO | None = None) -> bool:
    """True when stdout and ``stream`` (default stderr) are both terminals."""
    stream = sys.stderr if stream is None else stream
    try:
        return sys.stdout.isatty() and stream.isatty()
    except (AttributeError, ValueError):
        return False


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


class Progress:
    """A one-line progress bar (jobs or points done out of a total).

    Parameters
    ----------
    total : int or None
        Number of units; None draws a counter without bar or ETA.
    label : str
        Text before the bar.
    stream : file, optional
        Where to draw (default stderr).
    enabled : bool, optional
        Force on or off; default :func:`interactive`.
    delay_s : float
        Draw nothing until this long after the start (short work shows no bar).
    """

    def __init__(self, total: int | None, label: str = "replaysim", stream: TextIO | None = None,
                 enabled: bool | None = None, delay_s: float = 0.0):
        self.total = total
        self.label = label
        self.stream = sys.stderr if stream is None else stream
        self.enabled = interactive(self.stream) if enabled is None else enabled
        self.done = 0
        self.start = time.monotonic()
        self.delay_s = delay_s
        self._drawn = 0.0

    def line(self) -> str:
        """The current bar text."""
        elapsed = time.monotonic() - self.start
        if not self.total:
            return f"{self.label} {self.done} done  {_clock(elapsed)} elapsed"
        fraction = min(self.done / self.total, 1.0)
        filled = int(round(fraction * WIDTH))
        eta = elapsed / self.done * (self.total - self.done) if self.done else None
        return (
            f"{self.label} [{'#' * filled}{'.' * (WIDTH - filled)}] {self.done}/{self.total} "
            f"{fraction:4.0%}  {_clock(elapsed)} elapsed  ETA {'-:--' if eta is None else _clock(eta)}"
        )

    def update(self, done: int | None = None, force: bool = False) -> None:
        """Set (or advance by one) the units done and redraw, at most every 0.2 s."""
        self.done = self.done + 1 if done is None else done
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self.start < self.delay_s and not force:
            return
        if force or now - self._drawn >= REDRAW_S:
            self._drawn = now
            # Clear the line, draw, and return the cursor so other output overwrites the bar.
            self.stream.write(f"\r{self.line()}\x1b[K\r")
            self.stream.flush()

    def close(self) -> None:
        """Draw the final state and end the line (if a bar was drawn or no delay was asked)."""
        if self.enabled and (self._drawn or not self.delay_s):
            self.stream.write(f"\r{self.line()}\x1b[K\n")
            self.stream.flush()


class SweepWatcher:
    """Counts finished sweep points under a directory and draws a :class:`Progress`.

    Parameters
    ----------
    root : Path
        The sweep directory (may not exist yet).
    total : int or None
        Expected number of points.
    marker : str
        File name each finished point (re)writes (``point.json``).
    enabled : bool, optional
        Default :func:`interactive`.
    """

    def __init__(self, root: Path, total: int | None, marker: str, enabled: bool | None = None):
        self.root = Path(root)
        self.marker = marker
        self.progress = Progress(total, "sweep", enabled=enabled)
        self._before = self._scan()
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
        """Start polling (only when the bar is drawn)."""
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
        """Stop polling and draw the final count."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self.progress.done = self.count()
            self.progress.close()
