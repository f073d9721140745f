"""The timer on a real event loop and the real monotonic clock: bounded in count and time (< 5 s)."""
from __future__ import annotations

import asyncio
import gc
import random
from collections import Counter
from typing import Callable

from coordinator.timer import CallbackTask, MonotonicClock, SystemTimer
from tests.support.machine import LoopLateness
from tests.support.polling import wait_until


class Stamp:
    """A task and its expected expiration: records (itself, actual time) when it runs."""

    def __init__(self, delay_ms: int, clock: MonotonicClock, runs: list) -> None:
        self.expected_ms = 0
        self.task = CallbackTask(delay_ms, lambda: runs.append((self, clock.now_ms())))

    def cancel(self) -> None:
        self.task.cancel()


def schedule(timer: SystemTimer, clock: MonotonicClock, delay_ms: int, runs: list) -> Stamp:
    stamp = Stamp(delay_ms, clock, runs)
    stamp.expected_ms = clock.now_ms() + delay_ms
    timer.add(stamp.task)
    return stamp


async def test_ten_thousand_random_timers_fire_once_within_tolerance():
    # After hundreds of earlier tests in this process a full garbage collection can pause the loop for 100+ ms;
    # that is the test process's garbage, not the timer's lateness, so collect first and hold the GC off.
    gc.collect()
    gc.disable()
    try:
        await _ten_thousand_random_timers()
    finally:
        gc.enable()


async def _ten_thousand_random_timers() -> None:
    clock = MonotonicClock()
    timer = SystemTimer("realloop", clock=clock)
    timer.start()
    runs: list = []
    rng = random.Random(7)
    # every delay is at least 200 ms, so the time spent scheduling 10k tasks (long on a loaded machine, and the
    # reaper cannot run meanwhile) is not counted as lateness
    tasks = [schedule(timer, clock, rng.randint(200, 1_700), runs) for _ in range(10_000)]
    try:
        async with LoopLateness() as lost:  # what the loop itself lost meanwhile
            deadline_ms = max(t.expected_ms for t in tasks) + 1_000
            while len(runs) < len(tasks) and clock.now_ms() < deadline_ms:
                await asyncio.sleep(0.05)
    finally:
        await timer.close()
    assert len(runs) == len(tasks) and len({id(task) for task, _ in runs}) == len(tasks)
    lateness_ms = sorted(at_ms - task.expected_ms for task, at_ms in runs)
    assert lateness_ms[0] >= 0, "a timer fired early"
    # Generous bounds, a correctness check and not a measurement (bench/timer.py measures lateness): tests share
    # two cores with Kafka brokers and other test processes, so what the loop itself lost (a plain sleep's
    # lateness, measured alongside) is allowed on top. One stall of the loop makes late every timer due during it
    # (a sixth of them for a 260-ms stall in this 1.5-s span) but only one of the plain sleep's samples, so the
    # timers' p99 is allowed the longest stall, not the samples' p99.
    p99_ms = lateness_ms[len(lateness_ms) * 99 // 100]
    assert p99_ms <= 100 + lost.max_ms and lateness_ms[-1] <= 1_000 + lost.max_ms, (
        p99_ms, lateness_ms[-1], lost)
    # The reaper woke per bucket, not per ms of the 1.5 s span, nor per task.
    assert timer.wakeups < 1_600


async def test_reaper_sleeps_when_nothing_is_scheduled():
    timer = SystemTimer("idle")
    timer.start()
    await asyncio.sleep(0.1)
    assert timer.wakeups == 0 and timer._wake_handle is None
    await timer.close()


async def test_an_earlier_task_wakes_the_reaper_early():
    clock = MonotonicClock()
    timer = SystemTimer("early", clock=clock)
    timer.start()
    runs: list = []
    schedule(timer, clock, 5_000, runs)
    await asyncio.sleep(0.01)
    soon = schedule(timer, clock, 20, runs)
    try:
        async with LoopLateness() as lost:
            # bounded well before the 5-s task: a reaper still asleep until then fails it
            while not runs and clock.now_ms() < soon.expected_ms + 3_000:
                await asyncio.sleep(0.01)
    finally:
        await timer.close()
    assert [task for task, _ in runs] == [soon]
    # on top of what the loop itself lost meanwhile (two cores shared with brokers and other test processes)
    assert 0 <= runs[0][1] - soon.expected_ms <= 150 + lost.max_ms, (runs[0][1] - soon.expected_ms, lost)


async def test_cancelled_timers_leave_the_reaper_idle():
    clock = MonotonicClock()
    timer = SystemTimer("cancel", clock=clock)
    timer.start()
    runs: list = []
    tasks = [schedule(timer, clock, 30, runs) for _ in range(1_000)]
    for task in tasks:
        task.cancel()
    await asyncio.sleep(0.1)
    wakeups = timer.wakeups
    await asyncio.sleep(0.1)
    await timer.close()
    assert runs == [] and timer.size == 0
    # At most one wake-up per emptied bucket (the adds may straddle a few ms), then none at all.
    assert wakeups <= len({task.expected_ms for task in tasks}) and timer.wakeups == wakeups


async def test_close_stops_the_reaper_and_nothing_fires_afterwards():
    clock = MonotonicClock()
    timer = SystemTimer("close", clock=clock)
    timer.start()
    runs: list = []
    schedule(timer, clock, 30, runs)
    reaper = timer._reaper
    await timer.close()
    await asyncio.sleep(0.08)
    assert runs == [] and reaper is not None and reaper.done()


async def test_tasks_run_as_loop_callbacks_not_inside_the_drain():
    clock = MonotonicClock()
    timer = SystemTimer("callbacks", clock=clock)
    seen_inside_drain = []

    timer.start()
    timer.add(CallbackTask(5, lambda: seen_inside_drain.append(timer._draining)))
    try:
        await wait_until(lambda: seen_inside_drain, 10, "the 5-ms task's run", interval_s=0.002)
    finally:
        await timer.close()
    assert seen_inside_drain == [False]


async def test_a_failing_task_is_reported_to_the_loop_and_the_rest_still_run():
    loop = asyncio.get_running_loop()
    reported: list[dict] = []
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    clock = MonotonicClock()
    timer = SystemTimer("errors", clock=clock)
    runs: list = []

    def boom() -> None:
        raise RuntimeError("boom")

    timer.start()
    timer.add(CallbackTask(5, boom))
    after = schedule(timer, clock, 5, runs)
    try:
        await wait_until(lambda: runs and reported, 10, "both 5-ms tasks' runs", interval_s=0.002)
    finally:
        await timer.close()
        loop.set_exception_handler(None)
    assert [task for task, _ in runs] == [after]
    assert len(reported) == 1 and isinstance(reported[0]["exception"], RuntimeError)
    assert "timer errors" in reported[0]["message"]



class _Iterations:
    """Counts the loop's iterations from outside the timer: a callback that schedules itself again runs once per
    iteration, after the callbacks scheduled before it (the timer's batch callbacks, which also schedule their
    next batch with call_soon); `sample()` is called in each of its runs."""

    def __init__(self, sample: Callable[[], None] = lambda: None) -> None:
        self.count = 0
        self.running = True
        self._sample = sample
        self._loop = asyncio.get_running_loop()
        self._loop.call_soon(self._tick)

    def _tick(self) -> None:
        self.count += 1
        self._sample()
        if self.running:
            self._loop.call_soon(self._tick)


async def test_tasks_of_coarse_buckets_run_once_in_the_order_they_expired_a_batch_per_callback():
    """Coarse buckets larger than a cascade batch, all due at once (a loop that stalled past them): the rest of each
    is re-inserted CASCADE_BATCH entries per later callback, the expired tasks run RUN_BATCH per callback, in the
    order the timer expired them (a drain's batch is finished before a later cascade's tasks run), each once.
    Observed from outside the timer, per loop iteration: the tasks run (their record) and the tasks still in the
    wheels (`size`: what the cascade callbacks re-inserted and expired); each batch callback runs once per
    iteration."""
    from coordinator.timer import ManualClock
    from coordinator.timer.system_timer import CASCADE_BATCH, RUN_BATCH
    from coordinator.timer.testing import recording_task

    clock = ManualClock(0)
    timer = SystemTimer("drain", clock=clock)  # no executor: the loop's incremental cascades
    fired: list[tuple[object, int]] = []
    buckets, per_bucket = 4, 2 * CASCADE_BATCH
    for b in range(buckets):  # one 20-ms bucket of the second wheel each
        for j in range(per_bucket):
            timer.add(recording_task(100 + 40 * b + j % 20, (b, j), clock, fired))
    clock.advance(300)  # every bucket is due
    assert timer.advance_clock(0)
    # The drain flushed CASCADE_BATCH entries of the first bucket (all due: at once, or through the first wheel's
    # buckets, flushed in this drain in their order); the first bucket's rest and the later buckets wait behind it.
    assert timer.size == buckets * per_bucket - CASCADE_BATCH and fired == []
    samples: list[tuple[int, int]] = []  # per iteration: (tasks run, tasks in the wheels)
    iterations = _Iterations(lambda: samples.append((len(fired), timer.size)))
    try:
        for _ in range(200):
            if len(fired) == buckets * per_bucket:
                break
            await asyncio.sleep(0)
    finally:
        iterations.running = False
    assert sorted(name for name, _ in fired) == [(b, j) for b in range(buckets) for j in range(per_bucket)]
    # the order they expired: the drain's share of the first bucket by expiration (j % 20 ms after its start, in
    # the order added within a ms), then the cascades' shares in the order added, bucket after bucket
    drained = sorted(((0, j) for j in range(CASCADE_BATCH)), key=lambda name: (name[1] % 20, name[1]))
    first = set(drained)
    cascaded = [(b, j) for b in range(buckets) for j in range(per_bucket) if (b, j) not in first]
    assert [name for name, _ in fired] == drained + cascaded
    runs = [now - before for (now, _), (before, _) in zip(samples, [(0, 0)] + samples)]
    reinserted = [before - now for (_, now), (_, before) in
                  zip(samples, [(0, buckets * per_bucket - CASCADE_BATCH)] + samples)]
    assert 0 < max(runs) <= RUN_BATCH, runs
    assert 0 < max(reinserted) <= CASCADE_BATCH, reinserted
    assert timer.size == 0


async def test_tasks_a_running_task_adds_due_at_once_join_the_queue_without_a_second_runner():
    """A task whose run adds a task already due (delay 0) puts it in the queue being run: every one runs once, and
    no loop iteration runs more than RUN_BATCH of them (one runner per iteration, RUN_BATCH per run, however many
    are added while it runs: a second runner would run up to twice that in an iteration)."""
    from coordinator.timer.system_timer import RUN_BATCH

    timer = SystemTimer("chain")
    ran: list[tuple[int, int]] = []  # (n, the loop iteration it ran in)
    iterations = _Iterations()

    def chain(n: int) -> CallbackTask:
        def run() -> None:
            ran.append((n, iterations.count))
            if n < 3 * RUN_BATCH:
                timer.add(chain(n + 1))
                timer.add(chain(10_000 + n))  # a second one each time: the queue grows while it runs
        return CallbackTask(0, run)

    timer.add(chain(0))
    try:
        for _ in range(100):
            if len(ran) == 1 + 2 * 3 * RUN_BATCH:
                break
            await asyncio.sleep(0)
    finally:
        iterations.running = False
    assert sorted(n for n, _ in ran) == sorted([*range(3 * RUN_BATCH + 1), *(10_000 + n for n in range(3 * RUN_BATCH))])
    per_iteration = Counter(iteration for _, iteration in ran)
    assert max(per_iteration.values()) == RUN_BATCH, per_iteration  # full batches, never more
    await timer.close()
