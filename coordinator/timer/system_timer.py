"""SystemTimer: the timing wheels plus the delay queue of buckets and an asyncio reaper.

Kafka's SystemTimer runs a reaper thread that polls a DelayQueue of buckets and an executor thread that runs
expired tasks. Here one event loop owns everything, so there are no locks:
  - the reaper is one asyncio task that sleeps until the earliest bucket is due. Its wake-up is a
    `loop.call_later` armed for that bucket and re-armed only when an earlier bucket is offered; with no
    buckets nothing is armed and the reaper does not wake at all;
  - on waking it drains *every* expired bucket (advance the wheels to the bucket's expiration, flush it by
    re-inserting each entry) before anything else can add to the wheels;
  - expired tasks are never run inside that flush loop: the drain hands them to the executor (by default the
    loop's `call_soon`) as one batch, which runs after the drain is complete;
  - on the loop (no executor given), a bucket is cascaded at most CASCADE_BATCH entries per loop callback: a
    coarse bucket can hold most of the sessions (every member armed in the same 8 s), and re-inserting them all
    at once held the loop for O(members). The bucket leaves its wheel (a fresh one takes its slot), its rest
    stays linked in it (cancel and reschedule stay O(1)) and is re-inserted by the callbacks that follow. An
    entry already due when its turn comes runs at once, later only by the callbacks before it. (The finer
    buckets a drain polls after it are still flushed in that drain, as Kafka's reaper does, so tasks keep
    running in the order they expired; a drain-wide budget would leave them behind the coarse bucket's rest.
    A bucket whose window starts where every still-cascading bucket's has ended waits behind them instead:
    all their entries expired before its own.)
  - expired tasks wait in one queue and run RUN_BATCH per loop callback, in the order they expired.
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections import deque
from typing import Callable

from coordinator.timer.clock import Clock, MonotonicClock
from coordinator.timer.delay_queue import BucketQueue
from coordinator.timer.task import PENDING_RUN, TaskCounter, TimerTask, TimerTaskEntry, TimerTaskList
from coordinator.timer.wheel import TimingWheel

Executor = Callable[[Callable[[], None]], object]
RUN_BATCH = 256  # expired tasks run per loop callback (see _run_pending)
# Entries re-inserted per loop callback when buckets expire. A session's entry costs ~2.7 µs to re-insert at 100k
# members (the deadline check of TimerTask.postponable, then the wheel; cache misses): 512 ≈ 1.4 ms of CPU. At
# 2,048, two such callbacks in one loop iteration were 11 ms of a busy stretch (docs/performance.md).
CASCADE_BATCH = 512


class SystemTimer:
    def __init__(self, name: str = "timer", clock: Clock | None = None, tick_ms: int = 1, wheel_size: int = 20,
                 executor: Executor | None = None) -> None:
        self.name = name
        self._clock = clock if clock is not None else MonotonicClock()
        self._now_ms = self._clock.now_ms
        self._counter = TaskCounter()
        self._queue = BucketQueue(self._on_earliest_changed)
        self._heap = self._queue._heap  # read on the hot path: is any bucket due?
        self._wheel = TimingWheel(tick_ms, wheel_size, self._now_ms(), self._queue, self._counter)
        self._executor = executor
        self._expired: list[TimerTaskEntry] = []
        self._cascading: list[TimerTaskList] = []  # expired buckets out of the wheels, still holding entries
        self._cascading_until = 0  # end of the latest window among them: a bucket due from then on waits behind
        self._cascade_scheduled = False
        self._runs: deque[list[TimerTaskEntry]] = deque()  # expired on the loop, not run yet (_run_pending)
        self._run_from = 0  # where the first of _runs continues
        self._run_scheduled = False
        self._closed = False
        self._draining = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reaper: asyncio.Task[None] | None = None
        self._wake: asyncio.Future[None] | None = None
        self._wake_handle: asyncio.TimerHandle | None = None
        self._wake_at_ms: int | None = None
        self.wakeups = 0  # times the reaper woke up: a metric, and proof that it does not poll

    @property
    def size(self) -> int:
        """Tasks waiting in the wheels (not counting runs already handed to the executor)."""
        return self._counter.value

    @property
    def clock(self) -> Clock:
        return self._clock

    @property
    def wheel(self) -> TimingWheel:
        return self._wheel

    def add(self, task: TimerTask) -> None:
        """Schedules `task.run()` after `task.delay_ms`; adding a scheduled task again reschedules it."""
        if self._closed:
            return
        now_ms = self._now_ms()
        expiration_ms = task.delay_ms + now_ms
        entry = task._entry
        if entry is None:
            entry = task._entry = TimerTaskEntry(task, expiration_ms)
        else:
            if entry.list is not None:  # rescheduling: leave the old bucket (or drop the pending run)
                entry.list.remove(entry)
            entry.task = task
            entry.expiration_ms = expiration_ms
        wheel = self._wheel
        if now_ms >= wheel.current_time_ms + wheel.tick_ms:
            # The clock moved since the wheels last advanced. If no bucket is due, catching up is safe (every
            # pending bucket lies ahead) and places the entry relative to now instead of in a bucket that is
            # already due; if one is due, the next drain handles it and then this entry.
            heap = self._heap
            if not heap or heap[0][0] > now_ms:
                wheel.advance_clock(now_ms)
        if not wheel.add(entry):
            entry.list = PENDING_RUN
            self._submit([entry])

    def advance_clock(self, timeout_ms: int = 0) -> bool:
        """Drains every bucket expired at `clock.now_ms()` and hands expired tasks to the executor.

        Returns True if any bucket was processed. With timeout_ms == 0 it never blocks. A positive timeout
        blocks the calling thread (real sleep, at most until the earliest bucket) when nothing is due yet:
        that is only for driving the timer off the event loop; on the loop, use `start()`.
        """
        now_ms = self._now_ms()
        bucket = self._queue.poll(now_ms)
        if bucket is None and timeout_ms > 0:
            earliest_ms = self._queue.earliest_ms()
            wait_ms = timeout_ms if earliest_ms is None else min(timeout_ms, max(earliest_ms - now_ms, 0))
            time.sleep(wait_ms / 1000)
            now_ms = self._now_ms()
            bucket = self._queue.poll(now_ms)
        if bucket is None:
            self._wheel.advance_clock(now_ms)  # safe: no bucket is due, all lie ahead of now_ms
            return False
        expired = self._expired = []
        reinsert = self._reinsert
        wheel = self._wheel
        incremental = self._executor is None
        self._draining = True
        try:
            while bucket is not None:
                start_ms = bucket.expiration_ms
                wheel.advance_clock(start_ms)
                if incremental:
                    bucket.expiration_ms = -1
                    # A bucket whose window starts after every entry of a bucket still cascading would run its
                    # tasks before those earlier ones: it waits behind them instead.
                    behind = bool(self._cascading) and start_ms >= self._cascading_until
                    bucket.flush_some(reinsert, 0 if behind else CASCADE_BATCH)
                    if not bucket.is_empty:
                        wheel.detach(bucket)
                        self._cascading.append(bucket)
                        self._cascading_until = max(self._cascading_until, start_ms + bucket.tick_ms)
                else:
                    bucket.flush(reinsert)
                bucket = self._queue.poll(now_ms)
        finally:
            self._draining = False
        if self._cascading and not self._cascade_scheduled:
            self._cascade_scheduled = True
            asyncio.get_running_loop().call_soon(self._continue_cascades)
        # Every bucket left expires after now_ms, so moving the clocks to now cannot strand one of them.
        wheel.advance_clock(now_ms)
        if expired:
            self._submit(expired)
        return True

    def start(self) -> None:
        """Starts the reaper task on the running loop (real-time use). Idempotent."""
        if self._reaper is not None or self._closed:
            return
        self._loop = asyncio.get_running_loop()
        self._reaper = self._loop.create_task(self._reap(), name=f"ExpirationReaper-{self.name}")

    async def close(self) -> None:
        """Stops the reaper and drops every pending task: none fires afterwards."""
        self._closed = True
        self._disarm()
        reaper, self._reaper = self._reaper, None
        if reaper is not None:
            reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reaper
        for bucket in [*(b for level in self._wheel.levels() for b in level.buckets), *self._cascading]:
            for entry in bucket.entries():
                bucket.remove(entry)
            bucket.expiration_ms = -1
        self._cascading = []
        self._cascading_until = 0
        self._queue.clear()

    # -- internals -------------------------------------------------------------------------------------

    def _continue_cascades(self) -> None:
        """One loop callback's share of the buckets still cascading."""
        self._cascade_scheduled = False
        if self._closed or not self._cascading:
            return
        expired = self._expired = []
        budget = CASCADE_BATCH
        while self._cascading and budget > 0:
            bucket = self._cascading[0]
            budget -= bucket.flush_some(self._reinsert, budget)
            if bucket.is_empty:
                self._cascading.pop(0)
        if not self._cascading:
            self._cascading_until = 0
        if expired:
            self._submit(expired)
        if self._cascading:
            self._cascade_scheduled = True
            asyncio.get_running_loop().call_soon(self._continue_cascades)

    def _reinsert(self, entry: TimerTaskEntry) -> None:
        task = entry.task
        if task is not None and task.postponable:
            # moved later since it was scheduled: it waits for its new expiration from here (TimerTask.postponable)
            expiration_ms = task.postponed_ms(entry.expiration_ms)
            if expiration_ms > entry.expiration_ms:
                entry.expiration_ms = expiration_ms
        if not self._wheel.add(entry):
            entry.list = PENDING_RUN
            self._expired.append(entry)

    def _submit(self, entries: list[TimerTaskEntry]) -> None:
        if self._executor is not None:
            self._executor(functools.partial(self._run_expired, entries))
            return
        # On the loop: one queue of expired batches, run in the order they expired by one callback at a time
        self._runs.append(entries)
        if not self._run_scheduled:
            self._run_scheduled = True
            asyncio.get_running_loop().call_soon(self._run_pending)

    def _run_pending(self) -> None:
        """One loop callback's share (RUN_BATCH) of the expired tasks, oldest first. Thousands of operations can
        expire in one drain (groups formed together finish their initial join delay together; a stalled loop
        drains many buckets at once): a batch per loop iteration, so I/O and other callbacks (heartbeat answers)
        are served in between. One queue for every drain and cascade callback keeps the order in which tasks
        expired (a batch per drain, each continued by its own callback, let a later cascade's tasks run before
        the rest of an earlier drain's). Lists are walked by index, not sliced: a fresh copy of the rest per batch
        would be a young container the size of the storm for every young collection to traverse."""
        runs = self._runs
        if self._closed:
            runs.clear()
            self._run_scheduled = False
            return
        # _run_scheduled stays set while the batch runs: what a task's run submits joins the queue, no second runner
        budget = RUN_BATCH
        errors: list[tuple[TimerTask, Exception]] = []
        try:
            while runs and budget > 0:
                entries, first = runs[0], self._run_from
                last = min(len(entries), first + budget)
                self._run_entries(entries, first, last, errors)
                budget -= last - first
                if last == len(entries):
                    runs.popleft()
                    self._run_from = 0
                else:
                    self._run_from = last
        finally:
            if runs and not self._closed:
                asyncio.get_running_loop().call_soon(self._run_pending)
            else:
                self._run_scheduled = False
        if errors:
            self._report(errors)

    def _run_expired(self, entries: list[TimerTaskEntry]) -> None:
        """Every task of `entries` (the executor's way: it decides where and when)."""
        errors: list[tuple[TimerTask, Exception]] = []
        self._run_entries(entries, 0, len(entries), errors)
        if errors:
            self._report(errors)

    def _run_entries(self, entries: list[TimerTaskEntry], first: int, last: int,
                     errors: list[tuple[TimerTask, Exception]]) -> None:
        for index in range(first, last):
            # A task cancelled or rescheduled since it expired is no longer PENDING_RUN; skip it.
            if self._closed:
                break
            entry = entries[index]
            task = entry.task
            if entry.list is PENDING_RUN and task is not None:  # a pending entry always holds its task
                entry.task = entry.list = None  # idle entries do not hold their task
                try:
                    task.run()
                except Exception as exc:  # one failing task must not starve the rest of the batch
                    errors.append((task, exc))

    def _report(self, errors: list[tuple[TimerTask, Exception]]) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # driven by hand (tests with a synchronous executor): fail loudly
            raise errors[0][1] from None
        for task, exc in errors:
            loop.call_exception_handler(
                {"message": f"timer {self.name}: {task!r}.run() raised", "exception": exc})

    async def _reap(self) -> None:
        loop = self._loop
        assert loop is not None
        while True:
            self._wake = loop.create_future()
            self._arm(self._queue.earliest_ms())
            await self._wake
            self._wake = None
            self.wakeups += 1
            self.advance_clock(0)

    def _on_earliest_changed(self, expiration_ms: int) -> None:
        # Only while the reaper sleeps: during a drain it re-arms from the queue once the drain is over.
        if self._wake is not None and (self._wake_at_ms is None or expiration_ms < self._wake_at_ms):
            self._arm(expiration_ms)

    def _arm(self, expiration_ms: int | None) -> None:
        self._disarm()
        if expiration_ms is None or self._loop is None:
            return
        # The clock is floored to whole ms, so this never wakes before the bucket is due; an early wake-up
        # (a coarser loop clock) only re-arms for at least 1 ms, so there is no busy polling.
        delay_ms = max(expiration_ms - self._now_ms(), 0)
        self._wake_at_ms = expiration_ms
        self._wake_handle = self._loop.call_later(delay_ms / 1000, self._wake_up)

    def _disarm(self) -> None:
        if self._wake_handle is not None:
            self._wake_handle.cancel()
        self._wake_handle = None
        self._wake_at_ms = None

    def _wake_up(self) -> None:
        self._wake_handle = None
        self._wake_at_ms = None
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    def __repr__(self) -> str:
        return f"SystemTimer(name={self.name!r}, size={self.size})"
