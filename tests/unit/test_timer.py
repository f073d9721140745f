"""Timer unit tests under a manual clock: buckets, wheels, SystemTimer, and Kafka's worked examples."""
from __future__ import annotations

import pytest

from coordinator.timer import (
    PENDING_RUN, BucketQueue, CallbackTask, ManualClock, MonotonicClock, SystemTimer, TimerTask, TimerTaskEntry,
    TimerTaskList, TimingWheel,
)
from coordinator.timer.task import TaskCounter

from coordinator.timer.testing import location, manual_timer, recording_task


def advance_to(timer: SystemTimer, clock: ManualClock, time_ms: int) -> None:
    """Moves the clock 1 ms at a time, advancing the timer at each step (like a reaper that never sleeps)."""
    while clock.now_ms() < time_ms:
        clock.advance(1)
        timer.advance_clock()


# -- clocks --------------------------------------------------------------------------------------------

def test_manual_clock_moves_only_when_told():
    clock = ManualClock(5)
    assert clock.now_ms() == 5
    clock.advance(7)
    assert clock.now_ms() == 12
    with pytest.raises(ValueError):
        clock.advance(-1)


def test_monotonic_clock_is_integer_and_non_decreasing():
    clock = MonotonicClock()
    first, second = clock.now_ms(), clock.now_ms()
    assert isinstance(first, int) and second >= first


# -- bucket --------------------------------------------------------------------------------------------

def make_entries(count: int) -> list[TimerTaskEntry]:
    return [TimerTaskEntry(TimerTask(0), expiration_ms=i) for i in range(count)]


def test_bucket_add_remove_keeps_order_and_counter():
    counter = TaskCounter()
    bucket = TimerTaskList(counter)
    entries = make_entries(4)
    for entry in entries:
        bucket.add(entry)
    assert bucket.entries() == entries and counter.value == 4
    bucket.remove(entries[1])
    bucket.remove(entries[1])  # twice is harmless
    assert bucket.entries() == [entries[0], entries[2], entries[3]] and counter.value == 3
    assert entries[1].list is None and entries[1].next is None and entries[1].prev is None


def test_bucket_add_moves_entry_out_of_its_previous_bucket():
    counter = TaskCounter()
    first, second = TimerTaskList(counter), TimerTaskList(counter)
    entry = make_entries(1)[0]
    first.add(entry)
    second.add(entry)
    assert first.entries() == [] and second.entries() == [entry] and counter.value == 1


def test_bucket_flush_hands_every_entry_over_and_resets_expiration():
    counter = TaskCounter()
    bucket = TimerTaskList(counter)
    assert bucket.expiration_ms == -1
    assert bucket.set_expiration(40) is True
    assert bucket.set_expiration(40) is False
    entries = make_entries(3)
    for entry in entries:
        bucket.add(entry)
    seen = []
    bucket.flush(seen.append)
    assert seen == entries and bucket.entries() == [] and counter.value == 0 and bucket.expiration_ms == -1
    assert all(entry.list is None for entry in entries)


def test_flush_survives_reinsertion_into_the_same_bucket():
    bucket = TimerTaskList(TaskCounter())
    entries = make_entries(2)
    for entry in entries:
        bucket.add(entry)
    bucket.flush(bucket.add)
    assert bucket.entries() == entries


# -- delay queue ---------------------------------------------------------------------------------------

def test_bucket_queue_polls_in_expiration_order_and_reports_earlier_offers():
    earliest_changes = []
    queue = BucketQueue(earliest_changes.append)
    buckets = []
    for expiration_ms in (30, 10, 20, 10):
        bucket = TimerTaskList(TaskCounter())
        bucket.set_expiration(expiration_ms)
        queue.offer(bucket)
        buckets.append(bucket)
    assert earliest_changes == [30, 10]
    assert queue.poll(9) is None
    polled = [queue.poll(100) for _ in range(4)]
    assert [b.expiration_ms for b in polled] == [10, 10, 20, 30]
    assert queue.poll(100) is None and len(queue) == 0


# -- timing wheel --------------------------------------------------------------------------------------

def test_wheel_rejects_expired_and_places_by_tick():
    queue = BucketQueue()
    wheel = TimingWheel(tick_ms=10, wheel_size=5, start_ms=23, queue=queue)
    assert wheel.current_time_ms == 20 and wheel.interval_ms == 50
    assert wheel.add(TimerTaskEntry(TimerTask(0), 29)) is False   # same tick as the clock: expired
    entry = TimerTaskEntry(TimerTask(0), 47)
    assert wheel.add(entry) is True
    assert entry.list is wheel.buckets[4] and entry.list.expiration_ms == 40
    far = TimerTaskEntry(TimerTask(0), 75)                      # beyond 20 + 50: overflow wheel
    assert wheel.add(far) is True
    assert wheel.overflow_wheel is not None and wheel.overflow_wheel.tick_ms == 50
    assert far.list.expiration_ms == 50


def test_wheel_offers_a_bucket_once_per_expiration():
    queue = BucketQueue()
    wheel = TimingWheel(tick_ms=1, wheel_size=20, start_ms=0, queue=queue)
    for _ in range(3):
        wheel.add(TimerTaskEntry(TimerTask(0), 5))
    assert len(queue) == 1


def test_wheel_advance_rounds_down_and_cascades_to_overflow():
    wheel = TimingWheel(tick_ms=1, wheel_size=20, start_ms=0, queue=BucketQueue())
    wheel.add(TimerTaskEntry(TimerTask(0), 10_000))  # creates levels 2..4
    wheel.advance_clock(8_437)
    assert [w.current_time_ms for w in wheel.levels()] == [8_437, 8_420, 8_400, 8_000]


# -- SystemTimer ---------------------------------------------------------------------------------------

def test_task_fires_exactly_at_its_expiration_and_size_tracks_it():
    timer, clock = manual_timer()
    fired = []
    timer.add(recording_task(5, "a", clock, fired))
    assert timer.size == 1
    advance_to(timer, clock, 4)
    assert fired == [] and timer.size == 1
    advance_to(timer, clock, 10)
    assert fired == [("a", 5)] and timer.size == 0


def test_zero_and_negative_delays_run_at_once_but_through_the_executor():
    submitted = []
    clock = ManualClock(100)
    timer = SystemTimer(clock=clock, executor=submitted.append)
    fired = []
    timer.add(recording_task(0, "zero", clock, fired))
    timer.add(recording_task(-5, "negative", clock, fired))
    assert fired == [] and len(submitted) == 2 and timer.size == 0
    for run in submitted:
        run()
    assert fired == [("zero", 100), ("negative", 100)]


def test_cancel_prevents_run_and_frees_the_slot():
    timer, clock = manual_timer()
    fired = []
    task = recording_task(10, "a", clock, fired)
    timer.add(task)
    task.cancel()
    task.cancel()
    assert timer.size == 0 and not task.is_scheduled
    advance_to(timer, clock, 50)
    assert fired == []


def test_readding_a_task_reschedules_it():
    timer, clock = manual_timer()
    fired = []
    task = recording_task(10, "a", clock, fired)
    timer.add(task)
    advance_to(timer, clock, 8)
    timer.add(task)  # heartbeat: push the deadline out again
    assert timer.size == 1 and task.expiration_ms == 18
    advance_to(timer, clock, 17)
    assert fired == []
    advance_to(timer, clock, 18)
    assert fired == [("a", 18)]


def test_expired_tasks_run_only_after_the_whole_drain():
    submitted = []
    clock = ManualClock(0)
    timer = SystemTimer(clock=clock, executor=submitted.append)
    fired = []
    for delay_ms in (3, 7, 450, 9_000):
        timer.add(recording_task(delay_ms, delay_ms, clock, fired))
    clock.advance(10_000)
    assert timer.advance_clock() is True
    assert fired == [] and timer.size == 0 and len(submitted) == 1  # one batch for the whole drain
    submitted[0]()
    assert [name for name, _ in fired] == [3, 7, 450, 9_000]


def test_cancel_between_expiry_and_run_wins():
    submitted = []
    clock = ManualClock(0)
    timer = SystemTimer(clock=clock, executor=submitted.append)
    fired = []
    task = recording_task(5, "a", clock, fired)
    timer.add(task)
    clock.advance(5)
    timer.advance_clock()
    assert task._entry.list is PENDING_RUN and task.is_scheduled
    task.cancel()
    submitted[0]()
    assert fired == [] and not task.is_scheduled


def test_advance_clock_reports_whether_a_bucket_was_processed():
    timer, clock = manual_timer()
    assert timer.advance_clock() is False
    timer.add(recording_task(3, "a", clock, []))
    clock.advance(2)
    assert timer.advance_clock() is False
    clock.advance(1)
    assert timer.advance_clock() is True


def test_a_failing_task_does_not_starve_its_batch():
    clock = ManualClock(0)
    timer = SystemTimer(clock=clock, executor=lambda fn: fn())
    fired = []

    def boom() -> None:
        raise RuntimeError("boom")

    timer.add(CallbackTask(1, boom))
    timer.add(recording_task(1, "after", clock, fired))
    clock.advance(1)
    with pytest.raises(RuntimeError, match="boom"):
        timer.advance_clock()
    assert fired == [("after", 1)]


async def test_close_drops_pending_tasks_and_ignores_later_adds():
    timer, clock = manual_timer()
    fired = []
    for delay_ms in (5, 500, 50_000):
        timer.add(recording_task(delay_ms, delay_ms, clock, fired))
    await timer.close()
    assert timer.size == 0
    timer.add(recording_task(1, "late", clock, fired))
    clock.advance(100_000)
    assert timer.advance_clock() is False and fired == []


# -- Kafka's worked examples ---------------------------------------------------------------------------

def test_worked_example_tick_1_wheel_20_level_one():
    timer, clock = manual_timer()
    tasks = {d: recording_task(d, d, clock, []) for d in (2, 8, 19)}
    for task in tasks.values():
        timer.add(task)
    assert {d: location(timer, t) for d, t in tasks.items()} == {2: (1, 2), 8: (1, 8), 19: (1, 19)}
    assert [b.expiration_ms for b in timer.wheel.buckets if b.entries()] == [2, 8, 19]


def test_worked_example_350_and_450_cascade_down_the_levels():
    timer, clock = manual_timer()
    fired = []
    t350, t450 = recording_task(350, 350, clock, fired), recording_task(450, 450, clock, fired)
    timer.add(t350)
    timer.add(t450)
    assert location(timer, t350) == (2, 340)   # level 2 bucket [340, 360)
    assert location(timer, t450) == (3, 400)   # level 3 bucket [400, 800)
    advance_to(timer, clock, 340)
    assert location(timer, t350) == (1, 350)
    advance_to(timer, clock, 350)
    assert fired == [(350, 350)]
    advance_to(timer, clock, 399)
    assert location(timer, t450) == (3, 400)
    advance_to(timer, clock, 400)
    assert location(timer, t450) == (2, 440)   # level 2 bucket [440, 460)
    advance_to(timer, clock, 440)
    assert location(timer, t450) == (1, 450)
    advance_to(timer, clock, 449)
    assert fired == [(350, 350)]
    advance_to(timer, clock, 450)
    assert fired == [(350, 350), (450, 450)]


def test_worked_example_tick_1_wheel_3_buckets_per_level():
    c = 18  # a multiple of 9, as in the table
    timer, clock = manual_timer(start_ms=c, wheel_size=3)
    fired: dict[int, list[tuple[object, int]]] = {offset: [] for offset in range(1, 27)}
    tasks = {offset: recording_task(offset, offset, clock, fired[offset]) for offset in range(1, 27)}
    for task in tasks.values():
        timer.add(task)
    levels = {offset: location(timer, task) for offset, task in tasks.items()}
    # level 1 [c+1,c+1] [c+2,c+2]; level 2 [c+3,c+5] [c+6,c+8]; level 3 [c+9,c+17] [c+18,c+26]
    expected = {1: (1, c + 1), 2: (1, c + 2)}
    expected.update({o: (2, c + 3) for o in range(3, 6)})
    expected.update({o: (2, c + 6) for o in range(6, 9)})
    expected.update({o: (3, c + 9) for o in range(9, 18)})
    expected.update({o: (3, c + 18) for o in range(18, 27)})
    assert levels == expected
    clocks = lambda: [w.current_time_ms for w in timer.wheel.levels()]  # noqa: E731
    advance_to(timer, clock, c + 1)
    assert clocks() == [c + 1, c, c]
    advance_to(timer, clock, c + 2)
    assert clocks() == [c + 2, c, c]
    advance_to(timer, clock, c + 3)
    assert clocks() == [c + 3, c + 3, c]
    # The freed slots now stand for [c+5,c+5] (level 1) and [c+9,c+11] (level 2).
    late = recording_task(2, "c+5", clock, [])
    timer.add(late)
    assert location(timer, late) == (1, c + 5)
    assert all(location(timer, tasks[o]) == (3, c + 9) for o in range(9, 18))
    advance_to(timer, clock, c + 9)
    # Level 3's [c+9,c+17] expired: c+9 ran, the rest moved down to levels 1 and 2.
    assert fired[9] == [(9, c + 9)]
    assert [location(timer, tasks[o]) for o in (10, 11, 12, 15, 17)] == [
        (1, c + 10), (1, c + 11), (2, c + 12), (2, c + 15), (2, c + 15)]


def test_wheel_add_moves_an_entry_that_is_still_linked():
    queue = BucketQueue()
    wheel = TimingWheel(tick_ms=1, wheel_size=20, start_ms=0, queue=queue)
    entry = TimerTaskEntry(TimerTask(0), 5)
    wheel.add(entry)
    entry.expiration_ms = 9
    wheel.add(entry)
    assert wheel.buckets[5].entries() == [] and wheel.buckets[9].entries() == [entry]
