"""The README's main command in its short mode: `coordinator demo --duration` (what scripts/run.sh runs) starts
the embedded Kafka with its data in the given state directory, the project-built Jaeger, the coordinator and
simulated consumers, prints the addresses, gets a rebalance trace into Jaeger while it runs, exits 0 on its own,
leaves no process behind (Kafka's JVM, Jaeger), and keeps Kafka (its data and its address) for the next run, which
finds the groups the consumers formed (simulated ones, and the real confluent-kafka/aiokafka consumers')."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from coordinator.embedded.jaeger import built_jaeger
from tests.support.demo_run import DEMO_TIMEOUT_S, demo, processes_mentioning, run_demo_watching_jaeger

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
    assert "coordinator simulate: 1 groups × 4 members" in result.stderr  # the full table, in the log file
    assert "real consumers: 2 (confluent-kafka, aiokafka) in group demo-real" in output
    assert "2 confluent-kafka with group.protocol=consumer in group demo-kip848" in output
    assert re.search(r"records read through the relay \(demo-real\): confluent-kafka \d+, aiokafka \d+ "
                     r"\(of \d+ produced to demo-orders\)", output)  # the summary
    assert re.search(r"records read by group.protocol=consumer \(demo-kip848\): demo-kip848-0 \d+, "
                     r"demo-kip848-1 \d+ \(of \d+ produced to demo-orders\)", output)
    assert "coordinator demo: stopping" in output
    assert not processes_mentioning(str(state_dir)), "the embedded broker outlived the demo"
    assert list((state_dir / "kafka").rglob("meta.properties")), "the Kafka data was not kept for the next run"

    # the next run (the bare service) finds Kafka at the same address and the group the consumers formed
    again = demo(state_dir, "--duration", "2", "--consumers", "0")
    assert again.returncode == 0, again.stdout + again.stderr[-5000:]
    assert kafka_line(again.stdout) == kafka_line(output)
    # the simulated group and the real consumers' group, both left empty (the real ones closed: LeaveGroup)
    again_log = (state_dir / "demo.log").read_text()
    # (the consumer group's committed offsets have a classic holder too, when they committed before the end)
    assert re.search(r"event=coordinator_ready groups=[23] ", again_log), again_log[-3000:]
    assert "Loaded consumer group demo-kip848 with 0 members." in again_log
    assert "event=group_loaded group=demo-real generation=" in again_log
    assert re.search(r"event=group_loaded group=demo-real generation=\d+ state=Empty members=0", again_log)
    assert not processes_mentioning(str(state_dir))


ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
REBALANCED = re.compile(r"↻ (\S+) generation (\d+) in (\d+) ms(?:, \w+)? · trace ([0-9a-f]{8,32})")


def run_in_terminal(command: list[str], columns: int, interrupt_when: Any, timeout_s: float) -> str:
    """Runs `command` on a pseudo-terminal of `columns` columns, as a user's shell would; once
    `interrupt_when(output so far)` holds, sends it Ctrl-C (SIGINT) and reads to the end. Returns the raw
    output (escape sequences included)."""
    import fcntl
    import pty
    import signal
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    env = {**os.environ, "COLUMNS": str(columns), "LINES": "40", "TERM": "xterm-256color",
           "PYTHONUNBUFFERED": "1", "OTEL_BSP_SCHEDULE_DELAY": "500"}
    process = subprocess.Popen(command, stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True)
    os.close(slave)
    chunks: list[bytes] = []

    def read() -> None:
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the terminal's other side is closed
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.monotonic() + timeout_s
    try:
        while process.poll() is None and not interrupt_when(b"".join(chunks).decode(errors="replace")):
            assert time.monotonic() < deadline, "the demo never showed what the test waits for:\n" + \
                ANSI.sub("", b"".join(chunks).decode(errors="replace"))[-3000:]
            time.sleep(0.5)
        process.send_signal(signal.SIGINT)
        process.wait(max(30.0, deadline - time.monotonic()))
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        reader.join(10)
        os.close(master)
    assert process.returncode == 0, b"".join(chunks).decode(errors="replace")[-3000:]
    return b"".join(chunks).decode(errors="replace")


def test_demo_terminal_fits_80_columns_tells_the_story_and_keeps_logs_in_a_file(
        request: pytest.FixtureRequest) -> None:
    if built_jaeger() is None:
        pytest.fail("the project's Jaeger build is missing: run scripts/setup.sh (it builds it once per machine)")
    state_dir = Path(tempfile.mkdtemp(prefix="demo-", dir="/tmp")) / "s"  # short: its paths fit a line, as ~'s do
    request.addfinalizer(lambda: shutil.rmtree(state_dir.parent, ignore_errors=True))
    command = [sys.executable, "-m", "coordinator.cli", "--log-level", "INFO", "demo", "--state-dir", str(state_dir),
               "--listen", "127.0.0.1:0", "--consumers", "4", "--failure-rate", "30"]

    drawn_live: list[subprocess.CompletedProcess[str]] = []

    def failure_traced(output: str) -> bool:  # a member failed, then a rebalance ended, traced
        text = ANSI.sub("", output)
        failed = re.search(r"has failed, removing it\s+from\s+the\s+group", text)
        rebalanced = REBALANCED.search(text, failed.end()) if failed else None
        if rebalanced is None:
            return False
        # meanwhile, as a user would in another terminal: `coordinator trace <the id as printed>`, no flags (it
        # finds the running demo's Jaeger through the state directory); the span export takes a moment
        deadline = time.monotonic() + 30
        while not drawn_live or (drawn_live[-1].returncode != 0 and time.monotonic() < deadline):
            time.sleep(0 if not drawn_live else 1)
            drawn_live.append(subprocess.run(
                [sys.executable, "-m", "coordinator.cli", "trace", "--width", "200", rebalanced.group(4)],
                capture_output=True, text=True, timeout=60,
                env={**os.environ, "COORDINATOR_STATE_DIR": str(state_dir), "COORDINATOR_JAEGER_URL": ""}))
        return True

    raw = run_in_terminal(command, 80, failure_traced, DEMO_TIMEOUT_S)
    assert drawn_live[-1].returncode == 0, drawn_live[-1].stderr
    assert "join phase" in drawn_live[-1].stdout and "━━ rebalance of " in drawn_live[-1].stdout
    # what a terminal shows: each piece between line feeds and carriage returns, escape sequences removed
    shown = [ANSI.sub("", piece) for line in raw.replace("\r\n", "\n").split("\n") for piece in line.split("\r")]
    too_wide = [piece for piece in shown if len(piece) > 80]
    assert not too_wide, too_wide
    text = "\n".join(shown)
    assert re.search(r"\d+s · members \d/4 stable · rebalances \d+", text)  # the live status
    failed = re.search(r"✗ Member (\S+) in\s+group (\S+) has\s+failed, removing\s+it\s+from\s+the\s+group",
                       text)  # Kafka's line, wrapped under its time stamp
    assert failed, text[-3000:]
    # the group's next rebalance to end carries the failure (under way when it happened, or caused by it)
    after = next(m for m in REBALANCED.finditer(text, failed.end()) if m.group(1) == failed.group(2))
    trace_id = after.group(4)
    # no log line on the terminal: they are in the file the demo names
    assert not re.search(r"\d{2}:\d{2}:\d{2},\d{3} (INFO|WARNING|DEBUG) ", text), text[-3000:]
    assert "event=" not in text
    log_path = state_dir / "demo.log"
    assert f"full log: {log_path}" in text
    log_text = log_path.read_text()
    assert " INFO coordinator" in log_text and "has failed, removing it from the group" in log_text
    assert "event=demo_summary" in log_text  # the simulation's full table
    # Ctrl-C: the summary and where to look next
    assert "coordinator demo: stopping" in text
    assert re.search(r"coordinator demo: ran \d+ s", text)
    assert "rebalances: " in text and "where to look next" in text
    assert f"    coordinator trace --file {state_dir / 'traces.json'} --list" in text
    assert not (state_dir / "jaeger-url").exists()  # the Jaeger is gone with the demo

    # the saved traces draw the rebalance the terminal announced, with the failed member's line
    saved = subprocess.run([sys.executable, "-m", "coordinator.cli", "trace", "--file", str(state_dir / "traces.json"),
                            "--width", "200", trace_id], capture_output=True, text=True, timeout=60)
    assert saved.returncode == 0, saved.stderr
    assert f"rebalance of {failed.group(2)}" in saved.stdout and "join phase" in saved.stdout
    assert f"member failed: Member {failed.group(1)} in group {failed.group(2)} has failed, removing it from the " \
           f"group" in saved.stdout, saved.stdout
    assert not processes_mentioning(str(state_dir)), "the embedded broker outlived the demo"
