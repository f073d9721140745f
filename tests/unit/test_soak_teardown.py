"""A soak stopped by a signal leaves no process behind: `python -m bench.soak` with its real server (our
coordinator with the in-memory store) and two generator workers, sent SIGTERM while it warms up, exits
(128 + SIGTERM) after stopping and reaping every process it started, and none of them survives it."""
from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks (tells a survivor from a new process that reused its pid), or
    None when it is gone or a zombie (exited, only not reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] in ("Z", "X") else int(fields[19])


def _descendants(root: int) -> dict[int, int]:
    """pid -> start ticks of every live descendant of `root`."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    parents[int(entry)] = int(stat.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    found: dict[int, int] = {}
    frontier = [root]
    while frontier:
        parent = frontier.pop()
        for pid, ppid in parents.items():
            if ppid == parent and (ticks := _start_ticks(pid)) is not None:
                found[pid] = ticks
                frontier.append(pid)
    return found


def _wait_for_line(lines: queue.Queue[str], text: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    seen: list[str] = []
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=max(0.01, deadline - time.monotonic()))
        except queue.Empty:
            break
        seen.append(line.rstrip())
        if text in line:
            return
    raise AssertionError(f"no {text!r} from the soak within {timeout_s:g} s; it printed {seen[-10:]}")


@pytest.mark.timeout(90)
def test_sigterm_stops_and_reaps_every_process_the_soak_started() -> None:
    soak = subprocess.Popen(
        [sys.executable, "-m", "bench.soak", "--server", "memory", "--members", "40", "--group-size", "10",
         "--workers", "2", "--initial-delay-ms", "0", "--warmup-s", "600", "--duration-s", "600",
         "--event-loop", "asyncio"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        for line in soak.stdout or ():
            lines.put(line)

    threading.Thread(target=read, daemon=True).start()
    started: dict[int, int] = {}
    try:
        _wait_for_line(lines, "warming up", 60)  # server up, both workers formed their groups
        started = _descendants(soak.pid)
        assert len(started) >= 3, f"expected the server and two workers, found {started}"
        soak.send_signal(signal.SIGTERM)
        soak.wait(30)
        deadline = time.monotonic() + 5  # reaped before the soak exits; the bound is for the kernel's bookkeeping
        while (survivors := {pid for pid, ticks in started.items() if _start_ticks(pid) == ticks}):
            assert time.monotonic() < deadline, f"processes of the soak still running: {sorted(survivors)}"
            time.sleep(0.05)
        assert soak.returncode == 128 + signal.SIGTERM  # its teardown ran (the default action would be -SIGTERM)
    finally:
        if soak.poll() is None:
            soak.kill()
            soak.wait()
        for pid, ticks in started.items():  # never leave them to the next test, whatever failed
            if _start_ticks(pid) == ticks:
                os.kill(pid, signal.SIGKILL)
