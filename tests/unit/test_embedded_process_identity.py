"""A started process is named by (pid, start time): the leftover-JVM check at the end of a test session must not
take (and kill) another process that was handed the same pid after the counter wrapped."""

from __future__ import annotations

import subprocess

from coordinator.embedded import process_alive, process_start_ticks


def test_a_pid_with_another_start_time_is_not_the_process_started() -> None:
    child = subprocess.Popen(["sleep", "60"])
    try:
        started = process_start_ticks(child.pid)
        assert started is not None
        assert process_alive(child.pid) and process_alive(child.pid, started)
        assert not process_alive(child.pid, started - 1), "a process that started at another time is not ours"
    finally:
        child.kill()
        child.wait()
    assert not process_alive(child.pid, started)
    assert process_start_ticks(child.pid) is None or process_start_ticks(child.pid) != started
