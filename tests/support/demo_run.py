"""Running `coordinator demo` as a user would, for the demo's tests: the command, a short run, a run whose Jaeger is
watched for a rebalance trace while it runs, and the processes a run may leave behind."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

DEMO_TIMEOUT_S = 240


def processes_mentioning(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if text in (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def demo_command(state_dir: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "coordinator.cli", "--log-level", "INFO", "demo", "--state-dir", str(state_dir),
            "--listen", "127.0.0.1:0", *args]


def demo(state_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(demo_command(state_dir, "--no-jaeger", *args), capture_output=True, text=True,
                          timeout=DEMO_TIMEOUT_S, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def rebalance_trace(query_url: str) -> dict[str, Any] | None:
    """A trace of the coordinator's whose root is a rebalance span with its join and sync phases, if Jaeger has
    one yet."""
    query = urllib.parse.urlencode({"service": "coordinator", "lookback": "1h", "limit": 50})
    with urllib.request.urlopen(f"{query_url}/api/traces?{query}", timeout=10) as response:
        traces = json.loads(response.read())["data"] or []
    for trace in traces:
        spans = trace["spans"]
        names = {span["operationName"] for span in spans}
        roots = [span for span in spans if span["operationName"] == "rebalance" and not span.get("references")]
        if roots and {"join phase", "sync phase"} <= names:
            return trace
    return None


def run_demo_watching_jaeger(state_dir: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], Any, int]:
    """Runs the demo with its Jaeger; while it runs, polls the Jaeger URL it prints until a rebalance trace is
    there (bounded by the demo's own run). Returns the finished demo, the trace found (or None) and Jaeger's pid."""
    stderr_path = state_dir.parent / "demo.stderr"
    state_dir.mkdir(parents=True, exist_ok=True)
    lines: list[str] = []
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OTEL_BSP_SCHEDULE_DELAY": "500"}  # export spans promptly
    with open(stderr_path, "w") as stderr:
        process = subprocess.Popen(demo_command(state_dir, *args), stdout=subprocess.PIPE, stderr=stderr, text=True,
                                   env=env)
        reader = threading.Thread(target=lambda: lines.extend(process.stdout or ()), daemon=True)
        reader.start()
        trace = None
        deadline = time.monotonic() + DEMO_TIMEOUT_S
        try:
            while trace is None and process.poll() is None and time.monotonic() < deadline:
                url = next((m.group(1) for line in list(lines) if (m := re.search(r"Jaeger: (http://[^\s/]+)", line))),
                           None)
                if url is not None:
                    try:
                        trace = rebalance_trace(url)
                    except OSError:
                        pass  # Jaeger is going away with the demo
                time.sleep(0.5)
            process.wait(max(1.0, deadline - time.monotonic()))
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        reader.join(10)
    err = (state_dir / "demo.log").read_text()  # the demo's log lines go to its file, not to the terminal
    started = re.search(r"event=jaeger_started pid=(\d+)", err)
    assert started, "the demo did not start its Jaeger:\n" + err[-3000:]
    return subprocess.CompletedProcess(process.args, process.returncode, "".join(lines), err), trace, \
        int(started.group(1))
