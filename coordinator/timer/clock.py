"""Clocks: the only things in the coordinator that read time.

Everything that needs "now" receives a `Clock`; production code gets `MonotonicClock`, tests get a
`ManualClock` and move time by hand, so timing logic is deterministic and never sleeps.
"""
from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now_ms(self) -> int:
        """Milliseconds on a monotonic scale (the origin is arbitrary)."""
        ...


class MonotonicClock:
    """The real clock: monotonic, integer milliseconds (like Kafka's `Time.hiResClockMs()`)."""

    __slots__ = ()

    def now_ms(self) -> int:
        return time.monotonic_ns() // 1_000_000


class WallClock:
    """Milliseconds since the Unix epoch, for timestamps that are stored or shown (commit times, state-change
    times, event times): they must mean the same after a restart and on another host. Never for deadlines."""

    __slots__ = ()

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000


class ManualClock:
    """A clock that only moves when told to: for deterministic tests."""

    __slots__ = ("_now_ms",)

    def __init__(self, start_ms: int = 0) -> None:
        self._now_ms = start_ms

    def now_ms(self) -> int:
        return self._now_ms

    def advance(self, ms: int) -> None:
        if ms < 0:
            raise ValueError(f"a clock cannot go back: advance({ms})")
        self._now_ms += ms

    def __repr__(self) -> str:
        return f"ManualClock(now_ms={self._now_ms})"
