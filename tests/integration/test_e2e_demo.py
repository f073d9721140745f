"""The README's main command in its short mode: `coordinator demo --duration` (what scripts/run.sh runs) starts
the embedded Kafka with its data in the given state directory, the project-built Jaeger, the coordinator and
simulated consumers, prints the addresses, gets a rebalance trace into Jaeger while it runs, exits 0 on its own,
leaves no process behind (Kafka's JVM, Jaeger), and keeps Kafka (its data and its address) for the next run, which
finds the groups the consumers formed (simulated ones, and the real confluent-kafka/aiokafka consumers')."""

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

import pytest

from coordinator.embedded.jaeger import built_jaeger

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
    err = stderr_path.read_text()
    started = re.search(r"event=jaeger_started pid=(\d+)", err)
    assert started, "the demo did not start its Jaeger:\n" + err[-3000:]
    return subprocess.CompletedProcess(process.args, process.returncode, "".join(lines), err), trace, \
        int(started.group(1))


def kafka_line(output: str) -> str:
    return next(line for line in output.splitlines() if "Kafka (state and events)" in line)


def test_demo_short_mode_runs_end_to_end_and_leaves_nothing_running(tmp_path: Path) -> None:
    if built_jaeger() is None:
        pytest.fail("the project's Jaeger build is missing: run scripts/setup.sh (it builds it once per machine)")
    state_dir = tmp_path / "state"
    result, trace, jaeger_pid = run_demo_watching_jaeger(state_dir, "--duration", "15", "--consumers", "4",
                                                         "--failure-rate", "10")
    output = result.stdout
    assert result.returncode == 0, output + result.stderr[-5000:]
    assert trace is not None, "no rebalance trace reached the demo's Jaeger:\n" + result.stderr[-3000:]
    assert not Path(f"/proc/{jaeger_pid}").exists() or b"jaeger" not in Path(f"/proc/{jaeger_pid}/cmdline") \
        .read_bytes(), "the demo's Jaeger outlived it"
    assert "Jaeger: http://127.0.0.1:" in output
    assert "point your consumers at bootstrap.servers=127.0.0.1:" in output
    assert f"(embedded, data in {state_dir / 'kafka'})" in output
    assert "event topic: __coordinator_events" in output
    assert "simulated consumers: 1 groups × 4 members" in output
    assert "coordinator simulate: 1 groups × 4 members" in output  # the summary table at the end
    assert "real consumers: 2 (confluent-kafka, aiokafka) in group demo-real" in output
    assert "demo-real-0 (confluent-kafka)" in output and "demo-real-1 (aiokafka)" in output  # in the summary
    assert "coordinator demo: stopping" in output
    assert not processes_mentioning(str(state_dir)), "the embedded broker outlived the demo"
    assert list((state_dir / "kafka").rglob("meta.properties")), "the Kafka data was not kept for the next run"

    # the next run (the bare service) finds Kafka at the same address and the group the consumers formed
    again = demo(state_dir, "--duration", "2", "--consumers", "0")
    assert again.returncode == 0, again.stdout + again.stderr[-5000:]
    assert kafka_line(again.stdout) == kafka_line(output)
    # the simulated group and the real consumers' group, both left empty (the real ones closed: LeaveGroup)
    assert "event=coordinator_ready groups=2 " in again.stderr, again.stderr[-3000:]
    assert "event=group_loaded group=demo-real generation=" in again.stderr
    assert re.search(r"event=group_loaded group=demo-real generation=\d+ state=Empty members=0", again.stderr)
    assert not processes_mentioning(str(state_dir))
