"""An asyncio event loop on virtual time, driven by one seed.

`VirtualLoop` is asyncio's own `BaseEventLoop` (futures, tasks, call_soon/call_at, run_until_complete are the
standard library's) with three things replaced:
  - `time()` is a virtual clock that only moves when nothing is ready: it jumps to the next timer, so a run of
    ten virtual minutes takes as long as its callbacks take to execute;
  - there is no I/O: the "selector" never waits (the simulated network and Kafka are timers and futures);
  - `run_in_executor` (and so `asyncio.to_thread`) runs the function inline: no thread may add timing noise.

What the seed perturbs: timers due at the same virtual instant run in a seeded order (asyncio promises no
order among them; the real clock would make them differ by microseconds anyway), and everything outside the
coordinator — network latencies, Kafka's acknowledgements, client think times, faults — is drawn from the
seed, so two seeds interleave requests, acknowledgements and timer expirations differently. Callbacks made
ready by `call_soon` keep their FIFO order: asyncio documents it and production code may rely on it, so
shuffling them would manufacture interleavings no real loop can produce.

A loop that has nothing ready and no timer left cannot make progress: `SimulationStuck` is raised instead of
blocking forever.
"""
from __future__ import annotations

import asyncio
import collections
import heapq
import random
from asyncio import base_events, events
from typing import Any, Callable

EPOCH_MS = 1_700_000_000_000  # the virtual wall clock starts here (stored timestamps look like real ones)


class SimulationStuck(RuntimeError):
    """Nothing is ready and no timer is left: whatever is awaited can never happen."""


class _NoSelector:
    def select(self, timeout: float | None) -> list[Any]:
        return []


class VirtualLoop(base_events.BaseEventLoop):
    # BaseEventLoop's internals this loop drives (typeshed does not declare them)
    _ready: collections.deque[events.Handle]
    _scheduled: list[tuple[float, float, events.TimerHandle]]  # (when, a NaN of its own, the handle): call_at
    _timer_cancelled_count: int
    _stopping: bool
    _check_closed: Callable[[], None]

    def __init__(self, rng: random.Random) -> None:
        super().__init__()
        self._rng = rng
        self._now = 0.0
        self._now_ms = 0  # _now in whole ms, kept with it (read far more often than the clock moves)
        self._selector = _NoSelector()
        self._clock_resolution = 1e-9
        self.steps = 0  # callbacks run: the cost measure of a run

    # --- time -------------------------------------------------------------------------------------------------
    def time(self) -> float:
        return self._now

    def now_ms(self) -> int:
        return self._now_ms

    # --- what a real loop does with I/O and threads -----------------------------------------------------------
    def _process_events(self, event_list: list[Any]) -> None:
        pass

    def _write_to_self(self) -> None:
        pass

    def run_in_executor(self, executor: Any, func: Callable[..., Any],  # type: ignore[override]
                        *args: Any) -> asyncio.Future[Any]:
        future = self.create_future()
        try:
            future.set_result(func(*args))
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine, as an executor would
            future.set_exception(exc)
        return future

    # --- callbacks --------------------------------------------------------------------------------------------
    def call_soon(self, callback: Callable[..., object], *args: Any,  # type: ignore[override]
                  context: Any = None) -> events.Handle:
        """asyncio's call_soon without its debug-mode checks (the loop never runs in debug mode)."""
        self._check_closed()
        handle = events.Handle(callback, args, self, context)
        self._ready.append(handle)
        return handle

    # --- timers -----------------------------------------------------------------------------------------------
    def call_at(self, when: float, callback: Callable[..., object], *args: Any,  # type: ignore[override]
                context: Any = None) -> events.TimerHandle:
        """asyncio's call_at (without its debug-mode checks: the loop never runs in debug mode), with the timer
        heap holding (when, a NaN of its own, handle) instead of the handle: heapq then compares floats in C
        instead of calling TimerHandle.__lt__ in Python, with the same outcome for every comparison. Two entries
        due at the same instant compare as their handles do, neither before the other: the NaNs are distinct
        objects, neither equal nor less. So the heap, the order timers leave it and the seed's history are those
        of asyncio's own heap."""
        self._check_closed()
        timer = events.TimerHandle(when, callback, args, self, context)
        heapq.heappush(self._scheduled, (when, float("nan"), timer))
        timer._scheduled = True  # type: ignore[attr-defined]
        return timer

    # --- one iteration ----------------------------------------------------------------------------------------
    def _run_once(self) -> None:
        scheduled = self._scheduled
        heappop = heapq.heappop
        while scheduled and scheduled[0][2]._cancelled:
            self._timer_cancelled_count -= 1
            heappop(scheduled)[2]._scheduled = False  # type: ignore[attr-defined]
        ready = self._ready
        if not ready and not self._stopping:
            if not scheduled:
                raise SimulationStuck(f"nothing ready and no timer left at t={self._now:.3f}s")
            now = scheduled[0][0]
            if now > self._now:
                self._now = now
                # + 1e-6: a float sum like 0.1 + 0.2 must not floor to the millisecond below the one it means
                self._now_ms = int(now * 1000 + 1e-6)
        now = self._now
        due: list[events.TimerHandle] = []
        while scheduled and scheduled[0][0] <= now:
            handle = heappop(scheduled)[2]
            handle._scheduled = False  # type: ignore[attr-defined]
            if handle._cancelled:
                self._timer_cancelled_count -= 1
            else:
                due.append(handle)
        if len(due) > 1:
            due = self._seeded_order(due)
        ready.extend(due)
        popleft = ready.popleft
        ran = 0
        try:
            for _ in range(len(ready)):
                callback = popleft()
                if not callback._cancelled:
                    ran += 1
                    callback._run()
        finally:
            self.steps += ran

    def _seeded_order(self, due: list[events.TimerHandle]) -> list[events.TimerHandle]:
        """Earlier deadlines first; among equal deadlines, an order drawn from the seed."""
        draw = self._rng.random
        keyed = [(handle._when, draw(), index) for index, handle in enumerate(due)]  # type: ignore[attr-defined]
        keyed.sort()
        return [due[index] for _, _, index in keyed]


class VirtualClock:
    """The coordinator's `Clock` on the loop's virtual time (monotonic ms, or epoch ms with `epoch_ms`)."""

    __slots__ = ("_loop", "_offset_ms")

    def __init__(self, loop: VirtualLoop, epoch_ms: int = 0) -> None:
        self._loop = loop
        self._offset_ms = epoch_ms

    def now_ms(self) -> int:
        return self._loop.now_ms() + self._offset_ms
