"""What the machine took from a test: on a loaded machine (two cores shared with brokers and other test processes) a
wall-clock bound is fair only for the time the test's own thread could have run; the time it sat runnable waiting
for a CPU is the machine's, and is allowed on top."""
from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

_SCHEDSTAT = "/proc/thread-self/schedstat"  # ns on a CPU, ns runnable but waiting for one, timeslices


def _run_queue_wait_s() -> float:
    """The calling thread's total wait for a CPU while runnable (the kernel's run-queue delay); 0 where the kernel
    does not say (then the bounds are the plain wall-clock ones)."""
    try:
        with open(_SCHEDSTAT) as stat:
            return int(stat.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


@dataclass
class Span:
    wall_s: float = 0.0
    run_queue_s: float = 0.0  # of that, how long this thread waited for a CPU

    @property
    def own_s(self) -> float:
        """The wall time less what the machine took: a bound on this is a bound on the code, not the machine."""
        return self.wall_s - self.run_queue_s


@contextmanager
def timed_span() -> Iterator[Span]:
    """Wall time of the block on this thread, and its run-queue wait (both known once the block ends)."""
    span = Span()
    wall, waited = time.monotonic(), _run_queue_wait_s()
    try:
        yield span
    finally:
        span.wall_s, span.run_queue_s = time.monotonic() - wall, _run_queue_wait_s() - waited


class LoopLateness:
    """How late a plain short sleep wakes on the running loop, sampled again and again while in use: what the loop
    (and, the machine being one, a process beside it) lost to the machine meanwhile."""

    def __init__(self, probe_ms: int = 5) -> None:
        self.probe_ms = probe_ms
        self.samples_ms: list[float] = []
        self._probe: asyncio.Task[None] | None = None

    @property
    def max_ms(self) -> float:
        return max(self.samples_ms, default=0.0)

    def percentile_ms(self, percent: int) -> float:
        ordered = sorted(self.samples_ms) or [0.0]
        return ordered[len(ordered) * percent // 100]

    async def __aenter__(self) -> LoopLateness:
        self._probe = asyncio.get_running_loop().create_task(self._sample())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._probe is not None
        self._probe.cancel()
        await asyncio.gather(self._probe, return_exceptions=True)

    async def _sample(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            expected = loop.time() + self.probe_ms / 1000
            await asyncio.sleep(self.probe_ms / 1000)
            self.samples_ms.append(max(0.0, (loop.time() - expected) * 1000))

    def __repr__(self) -> str:
        return (f"LoopLateness(samples={len(self.samples_ms)}, p99_ms={self.percentile_ms(99):.0f}, "
                f"max_ms={self.max_ms:.0f})")
