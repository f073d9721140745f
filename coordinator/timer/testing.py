"""Helpers for tests that drive a timer by hand (also handy for other packages' unit tests)."""
from __future__ import annotations

from coordinator.timer.clock import ManualClock
from coordinator.timer.system_timer import SystemTimer
from coordinator.timer.task import CallbackTask, TimerTask


def manual_timer(start_ms: int = 0, tick_ms: int = 1, wheel_size: int = 20,
                 name: str = "test") -> tuple[SystemTimer, ManualClock]:
    """A timer on a ManualClock whose expired tasks run synchronously at the end of `advance_clock()`."""
    clock = ManualClock(start_ms)
    timer = SystemTimer(name, clock=clock, tick_ms=tick_ms, wheel_size=wheel_size, executor=lambda fn: fn())
    return timer, clock


def advance(timer: SystemTimer, clock: ManualClock, ms: int) -> bool:
    """Moves the clock by `ms` and lets the timer catch up in one drain; True if a bucket was processed."""
    clock.advance(ms)
    return timer.advance_clock()


def recording_task(delay_ms: int, name: object, clock: ManualClock, fired: list[tuple[object, int]]) -> TimerTask:
    """A task that appends (name, clock time) to `fired` when it runs."""
    return CallbackTask(delay_ms, lambda: fired.append((name, clock.now_ms())))


def location(timer: SystemTimer, task: TimerTask) -> tuple[int, int]:
    """(level numbered from 1, bucket expiration) of a scheduled task."""
    bucket = task._entry.list if task._entry is not None else None
    for level, wheel in enumerate(timer.wheel.levels(), start=1):
        for candidate in wheel.buckets:
            if candidate is bucket:
                return level, bucket.expiration_ms
    raise AssertionError(f"{task!r} is in no bucket")
