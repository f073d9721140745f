"""The README's main command in its short mode: `coordinator demo --duration` (what scripts/run.sh runs) starts
the embedded Kafka with its data in the given state directory, the coordinator and simulated consumers, prints
the addresses, exits 0 on its own, leaves no process behind, and keeps Kafka (its data and its address) for the
next run, which finds the group the consumers formed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


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


def demo(state_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "coordinator.cli", "--log-level", "INFO", "demo", "--no-jaeger", "--state-dir",
         str(state_dir), "--listen", "127.0.0.1:0", *args],
        capture_output=True, text=True, timeout=240, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def kafka_line(output: str) -> str:
    return next(line for line in output.splitlines() if "Kafka (state and events)" in line)


def test_demo_short_mode_runs_end_to_end_and_leaves_nothing_running(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    result = demo(state_dir, "--duration", "12", "--consumers", "4", "--failure-rate", "10")
    output = result.stdout
    assert result.returncode == 0, output + result.stderr[-5000:]
    assert "point your consumers at bootstrap.servers=127.0.0.1:" in output
    assert f"(embedded, data in {state_dir / 'kafka'})" in output
    assert "event topic: __coordinator_events" in output
    assert "simulated consumers: 1 groups × 4 members" in output
    assert "coordinator simulate: 1 groups × 4 members" in output  # the summary table at the end
    assert "coordinator demo: stopping" in output
    assert not processes_mentioning(str(state_dir)), "the embedded broker outlived the demo"
    assert list((state_dir / "kafka").rglob("meta.properties")), "the Kafka data was not kept for the next run"

    # the next run (the bare service) finds Kafka at the same address and the group the consumers formed
    again = demo(state_dir, "--duration", "2", "--consumers", "0")
    assert again.returncode == 0, again.stdout + again.stderr[-5000:]
    assert kafka_line(again.stdout) == kafka_line(output)
    assert "event=coordinator_ready groups=1 " in again.stderr, again.stderr[-3000:]
    assert not processes_mentioning(str(state_dir))
