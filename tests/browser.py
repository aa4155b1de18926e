"""Open an HTML page in headless Chromium and report what a reader would meet.

``python3 tests/browser.py PAGE [--screenshot PNG]`` prints one JSON object:
``errors`` (console errors and warnings, uncaught exceptions, failed loads
such as a missing resource or a blocked network request), ``plots`` (the
page's ``svg.plot`` elements: their ``data-plot`` names and how many shapes
each draws) and ``title``; it exits 1 when there are errors.

Chromium is driven through the DevTools protocol over a pipe
(``--remote-debugging-pipe``: messages are JSON, each ended by a NUL byte,
the browser reading fd 3 and writing fd 4), so nothing beyond the standard
library is needed and no port is opened.  Network access is refused for the
page (every request other than ``file:`` and ``data:`` fails and is
reported), so a page that needs the network shows it.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
#: Seconds to wait for the page's load event and its rendering.
LOAD_TIMEOUT_S = 60.0


def find_chromium() -> str | None:
    """The path of a Chromium-family browser on PATH (``$CHROMIUM`` first), or None."""
    named = os.environ.get("CHROMIUM")
    if named:
        return shutil.which(named) or (named if Path(named).is_file() else None)
    return next((path for path in map(shutil.which, CANDIDATES) if path), None)


class Browser:
    """A headless Chromium process spoken to over the DevTools pipe."""

    def __init__(self, executable: str):
        self._profile = tempfile.mkdtemp(prefix="replaysim-chromium-")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        os.set_inheritable(to_browser_r, True)
        os.set_inheritable(from_browser_w, True)

        def fds() -> None:  # the child's fd 3 reads, fd 4 writes (copies first: either may be 3 or 4)
            reads, writes = os.dup(to_browser_r), os.dup(from_browser_w)
            os.dup2(reads, 3)
            os.dup2(writes, 4)

        self._process = subprocess.Popen(
            [executable, "--headless", "--disable-gpu", "--no-sandbox", "--no-first-run", "--no-default-browser-check",
             "--disable-extensions", "--hide-scrollbars", "--remote-debugging-pipe", f"--user-data-dir={self._profile}",
             "about:blank"],
            preexec_fn=fds, pass_fds=(3, 4, to_browser_r, from_browser_w),  # 3, 4 kept open after fds()
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict] = []

    def _read_message(self, deadline: float) -> dict:
        while b"\0" not in self._buffer:
            if time.monotonic() > deadline:
                raise TimeoutError("Chromium did not answer in time")
            chunk = os.read(self._from_browser, 1 << 16)
            if not chunk:
                raise RuntimeError("Chromium closed its DevTools pipe")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def send(self, method: str, params: dict | None = None, session: str | None = None,
             timeout: float = LOAD_TIMEOUT_S) -> dict:
        """Call ``method`` and return its result (events arriving meanwhile go to :attr:`events`)."""
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_for(self, method: str, timeout: float = LOAD_TIMEOUT_S) -> dict:
        """The first event ``method`` (already received or coming)."""
        for event in self.events:
            if event.get("method") == method:
                return event
        deadline = time.monotonic() + timeout
        while True:
            event = self._read_message(deadline)
            self.events.append(event)
            if event.get("method") == method:
                return event

    def close(self) -> None:
        try:
            self.send("Browser.close", timeout=10)
        except Exception:  # noqa: BLE001 - it is going away either way
            pass
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        for fd in (self._to_browser, self._from_browser):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self._profile, ignore_errors=True)


#: Counts each plot's drawn shapes in the page.
PLOTS_JS = """JSON.stringify({
  title: document.title,
  plots: Array.from(document.querySelectorAll('svg.plot')).map(s => ({
    name: s.getAttribute('data-plot'),
    shapes: s.querySelectorAll('polyline, circle, rect:not(.frame)').length,
    width: s.getBoundingClientRect().width,
  })),
  tables: document.querySelectorAll('table').length,
})"""


def inspect(page: Path, screenshot: Path | None = None, executable: str | None = None,
            width: int = 1300) -> dict:
    """Load ``page`` in headless Chromium; its errors, plots and title (see the module docstring)."""
    executable = executable or find_chromium()
    if executable is None:
        raise FileNotFoundError("no Chromium found (apt-get install chromium, or set CHROMIUM)")
    browser = Browser(executable)
    try:
        target = browser.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = browser.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            browser.send(f"{domain}.enable", session=session)
        browser.send("Fetch.enable", {"patterns": [{"urlPattern": "http*"}, {"urlPattern": "ws*"}]},
                     session=session)
        browser.send("Emulation.setDeviceMetricsOverride",
                     {"width": width, "height": 1000, "deviceScaleFactor": 1, "mobile": False}, session=session)
        browser.send("Page.navigate", {"url": page.resolve().as_uri()}, session=session)
        deadline = time.monotonic() + LOAD_TIMEOUT_S
        loaded = False
        while not loaded:
            for event in list(browser.events):
                if event.get("method") == "Fetch.requestPaused":  # the network: refused, and reported below
                    browser.events.remove(event)
                    browser.send("Fetch.failRequest", {"requestId": event["params"]["requestId"],
                                                       "errorReason": "BlockedByClient"}, session=session)
                elif event.get("method") == "Page.loadEventFired":
                    loaded = True
            if not loaded:
                browser.events.append(browser._read_message(deadline))
        found = json.loads(browser.send("Runtime.evaluate", {"expression": PLOTS_JS, "returnByValue": True},
                                        session=session)["result"]["value"])
        if screenshot is not None:
            size = browser.send("Runtime.evaluate", {"expression": "document.documentElement.scrollHeight",
                                                     "returnByValue": True}, session=session)["result"]["value"]
            browser.send("Emulation.setDeviceMetricsOverride",
                         {"width": width, "height": int(min(size, 16000)), "deviceScaleFactor": 1,
                          "mobile": False}, session=session)
            data = browser.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True},
                                session=session)["data"]
            screenshot.write_bytes(base64.b64decode(data))
        browser.send("Runtime.evaluate", {"expression": "1"}, session=session)  # flush late events
    finally:
        browser.close()
    errors = []
    for event in browser.events:
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "warning", "assert"):
            text = " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", []))
            errors.append(f"console.{params['type']}: {text}")
        elif method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            errors.append(f"exception: {details.get('exception', {}).get('description') or details.get('text')}")
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") in ("error", "warning"):
            entry = params["entry"]
            errors.append(f"log {entry['level']}: {entry.get('text')} {entry.get('url', '')}".strip())
        elif method == "Network.loadingFailed":
            errors.append(f"load failed: {params.get('errorText')} ({params.get('type')})")
    return {"errors": errors, **found}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("page", type=Path, help="the HTML file")
    parser.add_argument("--screenshot", type=Path, help="write a full-page PNG here")
    args = parser.parse_args(argv)
    report = inspect(args.page, args.screenshot)
    print(json.dumps(report, indent=1))
    return 1 if report["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
