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
import contextvars
import functools
import heapq
import random
import sys
import threading
from asyncio import base_events, events, format_helpers
from typing import Any, Callable

_NAN = float("nan")
EPOCH_MS = 1_700_000_000_000  # the virtual wall clock starts here (stored timestamps look like real ones)


class SimulationStuck(RuntimeError):
    """Nothing is ready and no timer is left: whatever is awaited can never happen."""


class _Handle(events.Handle):
    """asyncio's Handle, built without the debug-mode check (the loop never runs in debug mode)."""

    __slots__ = ()

    def __init__(self, callback: Callable[..., object], args: tuple[Any, ...], loop: VirtualLoop,
                 context: Any = None) -> None:
        self._context = contextvars.copy_context() if context is None else context
        self._loop = loop
        self._callback = callback
        self._args = args
        self._cancelled = False
        self._repr = None
        self._source_traceback = None


class _Timer(events.TimerHandle):
    """asyncio's TimerHandle, built and cancelled without the debug-mode checks (one call instead of four: an
    `asyncio.sleep` cancels its timer every time it returns). The same state after each as asyncio's."""

    __slots__ = ()

    def __init__(self, when: float, callback: Callable[..., object], args: tuple[Any, ...], loop: VirtualLoop,
                 context: Any = None) -> None:
        self._context = contextvars.copy_context() if context is None else context
        self._loop = loop
        self._callback = callback
        self._args = args
        self._cancelled = False
        self._repr = None
        self._source_traceback = None
        self._when = when
        self._scheduled = True  # it goes on the heap at once (call_at)

    def cancel(self) -> None:
        if not self._cancelled:
            if self._scheduled:  # BaseEventLoop._timer_handle_cancelled
                self._loop._timer_cancelled_count += 1
            self._cancelled = True
            self._callback = None  # type: ignore[assignment]
            self._args = None  # type: ignore[assignment]


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
    _closed: bool

    def __init__(self, rng: random.Random) -> None:
        super().__init__()
        self._rng = rng
        self._now = 0.0
        self._now_ms = 0  # _now in whole ms, kept with it (read far more often than the clock moves)
        self._selector = _NoSelector()
        self._clock_resolution = 1e-9
        self.steps = 0  # callbacks run: the cost measure of a run
        # asyncio's create_future (Future(loop=self)) as a C call instead of a Python method calling it
        self.create_future = functools.partial(asyncio.Future, loop=self)  # type: ignore[method-assign]

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

    def create_task(self, coro: Any, *, name: str | None = None,  # type: ignore[override]
                    context: Any = None) -> asyncio.Task[Any]:
        """asyncio's create_task (no task factory is ever set here) without its debug-mode bookkeeping."""
        if self._closed:
            raise RuntimeError("Event loop is closed")
        return asyncio.Task(coro, loop=self, name=name, context=context)

    # --- callbacks --------------------------------------------------------------------------------------------
    def call_soon(self, callback: Callable[..., object], *args: Any,  # type: ignore[override]
                  context: Any = None) -> events.Handle:
        """asyncio's call_soon without its debug-mode checks (the loop never runs in debug mode)."""
        if self._closed:
            raise RuntimeError("Event loop is closed")
        handle = _Handle(callback, args, self, context)
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
        if self._closed:
            raise RuntimeError("Event loop is closed")
        timer = _Timer(when, callback, args, self, context)
        heapq.heappush(self._scheduled, (when, _NAN + 0.0, timer))  # a NaN object of its own
        return timer

    def call_later(self, delay: float, callback: Callable[..., object], *args: Any,  # type: ignore[override]
                   context: Any = None) -> events.TimerHandle:
        """asyncio's call_later: call_at(time() + delay), in one call."""
        if delay is None:
            raise TypeError("delay must not be None")
        return self.call_at(self._now + delay, callback, *args, context=context)

    # --- the iterations -------------------------------------------------------------------------------------
    def run_forever(self) -> None:
        """asyncio's run_forever, its iterations (`_run_once`) inlined in one loop."""
        self._check_closed()
        self._check_running()  # type: ignore[attr-defined]
        self._set_coroutine_origin_tracking(self._debug)  # type: ignore[attr-defined]
        old_agen_hooks = sys.get_asyncgen_hooks()
        try:
            self._thread_id = threading.get_ident()
            sys.set_asyncgen_hooks(firstiter=self._asyncgen_firstiter_hook,  # type: ignore[attr-defined]
                                   finalizer=self._asyncgen_finalizer_hook)  # type: ignore[attr-defined]
            events._set_running_loop(self)
            self._run_until_stopped()
        finally:
            self._stopping = False
            self._thread_id = None  # type: ignore[assignment]
            events._set_running_loop(None)
            self._set_coroutine_origin_tracking(False)  # type: ignore[attr-defined]
            sys.set_asyncgen_hooks(*old_agen_hooks)

    def _run_once(self) -> None:
        """One iteration (what BaseEventLoop.run_forever repeats); `run_forever` runs them inline."""
        self._run_until_stopped(once=True)

    def _run_until_stopped(self, once: bool = False) -> None:
        """Iterations until `stop()`: the timers due (ties in the seed's order) join the ready callbacks, which
        run in FIFO order (asyncio's Handle._run inlined: the same call, the same report of an exception)."""
        scheduled = self._scheduled
        ready = self._ready
        heappop = heapq.heappop
        popleft = ready.popleft
        while True:
            while scheduled and scheduled[0][2]._cancelled:
                self._timer_cancelled_count -= 1
                heappop(scheduled)[2]._scheduled = False  # type: ignore[attr-defined]
            if not ready and not self._stopping:
                if not scheduled:
                    raise SimulationStuck(f"nothing ready and no timer left at t={self._now:.3f}s")
                now = scheduled[0][0]
                if now > self._now:
                    self._now = now
                    # + 1e-6: a float sum like 0.1 + 0.2 must not floor to the millisecond below the one it means
                    self._now_ms = int(now * 1000 + 1e-6)
            now = self._now
            if scheduled and scheduled[0][0] <= now:
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
            ran = 0
            try:
                for _ in range(len(ready)):
                    callback = popleft()
                    if not callback._cancelled:
                        ran += 1
                        try:
                            callback._context.run(callback._callback, *callback._args)  # type: ignore[attr-defined]
                        except (SystemExit, KeyboardInterrupt):
                            raise
                        except BaseException as exc:  # noqa: BLE001 - Handle._run's report
                            self._callback_raised(callback, exc)
            finally:
                self.steps += ran
            if once or self._stopping:
                return

    def _callback_raised(self, handle: events.Handle, exc: BaseException) -> None:
        """What asyncio's Handle._run does when its callback raises."""
        source = format_helpers._format_callback_source(handle._callback, handle._args)  # type: ignore
        context: dict[str, Any] = {"message": f"Exception in callback {source}", "exception": exc, "handle": handle}
        if handle._source_traceback:  # type: ignore[attr-defined]
            context["source_traceback"] = handle._source_traceback  # type: ignore[attr-defined]
        self.call_exception_handler(context)

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
