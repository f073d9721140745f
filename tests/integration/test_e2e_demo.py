"""The README's main command in its short mode: `coordinator demo --duration` (what scripts/run.sh runs) starts
the embedded Kafka with its data in the given state directory, the coordinator and simulated consumers, prints
the addresses, exits 0 on its own, leaves no process behind, and keeps the Kafka data for the next run."""

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


def test_demo_short_mode_runs_end_to_end_and_leaves_nothing_running(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    result = subprocess.run(
        [sys.executable, "-m", "coordinator.cli", "--log-level", "WARNING", "demo", "--duration", "12",
         "--consumers", "4", "--failure-rate", "10", "--no-jaeger", "--state-dir", str(state_dir),
         "--listen", "127.0.0.1:0"],
        capture_output=True, text=True, timeout=240, env={**os.environ, "PYTHONUNBUFFERED": "1"})
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
