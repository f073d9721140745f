"""Render the HTML report in headless Chromium (Debian's `chromium`) over the DevTools protocol on a pipe: a
screenshot, what the page shows (plots, their sizes and bars) and every script error or console error. Used by the
tests (the report must render, not only exist) and to take the README's picture:

    python -m analytics.render OUT/report.html docs/img/analytics-report.png [MAX_HEIGHT_PX]
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Headless with no sandbox (containers, root), and none of Chromium's calls home: the network is closed here and
# refused connections to Google's services would otherwise be retried many at a time.
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-extensions",
                  "--disable-default-apps", "--mute-audio", "--hide-scrollbars", "--remote-debugging-pipe")

_INSPECT = """JSON.stringify({
  title: document.title,
  plots: [...document.querySelectorAll('svg.plot')].map(svg => {
    const box = svg.getBoundingClientRect();
    return {name: svg.dataset.plot, width: box.width, height: box.height,
            bars: [...svg.querySelectorAll('rect.bar')].filter(r => r.getBoundingClientRect().height > 0 &&
                   r.getBoundingClientRect().width > 0).length,
            empty: svg.querySelector('text.empty') !== null};
  }),
  tables: [...document.querySelectorAll('table[data-table]')].map(t => ({
    name: t.dataset.table, rows: t.tBodies[0].rows.length})),
  scripts: document.scripts.length,
  external: [...document.querySelectorAll('[src],link[href]')].map(e => e.src || e.href),
})"""


class RenderError(RuntimeError):
    pass


@dataclass
class Rendered:
    page: dict[str, Any]  # _INSPECT's result
    errors: list[str] = field(default_factory=list)  # exceptions, console errors, failed loads
    screenshot: bytes = b""

    def plot(self, name: str) -> dict[str, Any]:
        return next(plot for plot in self.page["plots"] if plot["name"] == name)


def _log() -> Any:
    """Chromium's own log (dbus complaints and the like) goes to a file named by CHROMIUM_LOG, else nowhere."""
    path = os.environ.get("CHROMIUM_LOG")
    return open(path, "ab") if path else subprocess.DEVNULL


def chromium_path() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    raise RenderError("no chromium on PATH (Debian: apt-get install chromium; scripts/setup.sh does it)")


class _DevTools:
    """The DevTools protocol over --remote-debugging-pipe: JSON messages ending in NUL, fd 3 in, fd 4 out."""

    def __init__(self, process: subprocess.Popen[bytes], to_browser: int, from_browser: int) -> None:
        self.process, self.to_browser, self.from_browser = process, to_browser, from_browser
        self.buffer = b""
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    def call(self, method: str, session: str | None = None, timeout_s: float = 60, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        message: dict[str, Any] = {"id": self.next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        os.write(self.to_browser, json.dumps(message).encode() + b"\0")
        reply = self._until(lambda m: m.get("id") == self.next_id, timeout_s, method)
        if "error" in reply:
            raise RenderError(f"{method}: {reply['error']}")
        return reply.get("result", {})

    def wait_event(self, method: str, timeout_s: float = 60) -> dict[str, Any]:
        for event in self.events:
            if event.get("method") == method:
                return event
        return self._until(lambda m: m.get("method") == method, timeout_s, method)

    def _until(self, matches: Any, timeout_s: float, what: str) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            while b"\0" in self.buffer:
                raw, self.buffer = self.buffer.split(b"\0", 1)
                message = json.loads(raw)
                if "method" in message:
                    self.events.append(message)
                if matches(message):
                    return message
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RenderError(f"Chromium did not answer {what} within {timeout_s:.0f}s")
            ready, _, _ = select.select([self.from_browser], [], [], min(remaining, 1.0))
            if ready:
                chunk = os.read(self.from_browser, 1 << 20)
                if not chunk:
                    raise RenderError(f"Chromium exited (code {self.process.poll()}) while waiting for {what}")
                self.buffer += chunk


def _high_pipe() -> tuple[int, int]:
    """A pipe whose ends are above 4, so that moving them to 3 and 4 in the child can clobber neither."""
    ends = []
    for fd in os.pipe():
        ends.append(fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10))
        os.close(fd)
    return ends[0], ends[1]


def render(report: Path, width: int = 1120, timeout_s: float = 90, max_height: int | None = None) -> Rendered:
    """Load `report` in headless Chromium; return what it shows, its errors and a full-page PNG."""
    browser_in, our_out = _high_pipe()  # we write commands, Chromium reads them on its fd 3
    our_in, browser_out = _high_pipe()  # Chromium writes on its fd 4
    profile = tempfile.mkdtemp(prefix="chromium-profile-")

    def give_fds() -> None:
        os.dup2(browser_in, 3)
        os.dup2(browser_out, 4)

    process = subprocess.Popen([chromium_path(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "about:blank"],
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=_log(),
                               preexec_fn=give_fds, close_fds=False)  # dup2 leaves 3 and 4 inheritable;
    # Python's own descriptors are close-on-exec (PEP 446), so nothing else leaks into Chromium
    os.close(browser_in)
    os.close(browser_out)
    tools = _DevTools(process, our_out, our_in)
    try:
        return _render_page(tools, report.resolve(), width, timeout_s, max_height)
    finally:
        try:
            tools.call("Browser.close", timeout_s=5)
        except (RenderError, OSError):
            pass
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        os.close(our_out)
        os.close(our_in)
        shutil.rmtree(profile, ignore_errors=True)


def _render_page(tools: _DevTools, report: Path, width: int, timeout_s: float,
                 max_height: int | None) -> Rendered:
    target = tools.call("Target.createTarget", url="about:blank", timeout_s=timeout_s)["targetId"]
    session = tools.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
    for domain in ("Page", "Runtime", "Log"):
        tools.call(f"{domain}.enable", session)
    tools.call("Emulation.setDeviceMetricsOverride", session, width=width, height=900, deviceScaleFactor=1,
               mobile=False)
    navigated = tools.call("Page.navigate", session, url=report.as_uri())
    errors = [f"navigation: {navigated['errorText']}"] if navigated.get("errorText") else []
    tools.wait_event("Page.loadEventFired", timeout_s)
    evaluated = tools.call("Runtime.evaluate", session, expression=_INSPECT, returnByValue=True)
    if "exceptionDetails" in evaluated:
        raise RenderError(f"inspecting the page failed: {evaluated['exceptionDetails']}")
    page = json.loads(evaluated["result"]["value"])
    height = tools.call("Page.getLayoutMetrics", session)["cssContentSize"]["height"]
    height = min(height, max_height) if max_height else height
    shot = tools.call("Page.captureScreenshot", session, format="png", captureBeyondViewport=True,
                      clip={"x": 0, "y": 0, "width": width, "height": height, "scale": 1})
    for event in tools.events:
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.exceptionThrown":
            errors.append(f"exception: {params['exceptionDetails'].get('text')}")
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            errors.append(f"console.{params['type']}: {params.get('args')}")
        elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
            errors.append(f"log: {params['entry'].get('text')}")
    return Rendered(page, errors, base64.b64decode(shot["data"]))


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3):
        print("usage: python -m analytics.render REPORT.html OUT.png [MAX_HEIGHT_PX]", file=sys.stderr)
        return 2
    rendered = render(Path(argv[0]), max_height=int(argv[2]) if len(argv) == 3 else None)
    Path(argv[1]).write_bytes(rendered.screenshot)
    print(json.dumps({"plots": rendered.page["plots"], "errors": rendered.errors}))
    return 1 if rendered.errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
