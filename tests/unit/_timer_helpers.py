"""Shared helpers for the timer and purgatory tests (a real TimerTask subclass, wheel introspection)."""
from __future__ import annotations

from coordinator.timer import ManualClock, SystemTimer, TimerTask


class RecordingTask(TimerTask):
    """Appends (name, clock time) to `fired` when it runs."""

    __slots__ = ("name", "clock", "fired")

    def __init__(self, delay_ms: int, name: object, clock: ManualClock, fired: list) -> None:
        super().__init__(delay_ms)
        self.name = name
        self.clock = clock
        self.fired = fired

    def run(self) -> None:
        self.fired.append((self.name, self.clock.now_ms()))


def manual_timer(start_ms: int = 0, tick_ms: int = 1, wheel_size: int = 20) -> tuple[SystemTimer, ManualClock]:
    clock = ManualClock(start_ms)
    timer = SystemTimer("test", clock=clock, tick_ms=tick_ms, wheel_size=wheel_size, executor=lambda fn: fn())
    return timer, clock


def location(timer: SystemTimer, task: TimerTask) -> tuple[int, int]:
    """(level numbered from 1, bucket expiration) of a scheduled task."""
    bucket = task._entry.list
    for level, wheel in enumerate(timer.wheel.levels(), start=1):
        for candidate in wheel.buckets:
            if candidate is bucket:
                return level, bucket.expiration_ms
    raise AssertionError(f"{task!r} is in no bucket")
