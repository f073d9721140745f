"""Hierarchical timing wheels (the design of Kafka's purgatory timer, after Varghese & Lauck).

Theory
------
A timing wheel is a ring of `wheel_size` buckets, each covering one tick of `tick_ms`. A task that expires at
time e goes into the bucket of its tick, `e // tick_ms`, at ring position `(e // tick_ms) % wheel_size`; the
bucket's expiration is the start of that tick, `(e // tick_ms) * tick_ms`. The wheel's clock, `current_time_ms`,
is always a multiple of `tick_ms`; a task with `e < current_time_ms + tick_ms` belongs to the tick that is
already running, so it is expired and runs at once. One ring covers `interval_ms = tick_ms * wheel_size`: as the
clock moves one tick, the bucket just emptied is reused for the tick `interval_ms` later. Starting and stopping
a timer cost O(1); a binary heap (asyncio's `call_later`, Java's DelayQueue of tasks) costs O(log n) for both,
and a cancelled heap entry lingers until it reaches the top or the heap is rebuilt.

A single ring only reaches `interval_ms` ahead. Tasks further out overflow to a second wheel whose tick is
the first wheel's whole interval, and so on: level k+1 has `tick = tick_k * wheel_size`. With the defaults
(tick 1 ms, 20 buckets) the levels span 20 ms, 400 ms, 8 s, 160 s, 3200 s; a 45 s session timeout sits in
level 4 (8 s buckets). Overflow wheels are created only when first needed. When a coarse bucket expires, its
tasks are re-inserted from the top: each either lands in a finer wheel (it is now close enough) or is expired.
A task therefore moves down at most once per level: insertion costs O(levels), removal stays O(1).

Nothing ticks when nothing is due. Only buckets go into a delay queue (a heap by bucket expiration), and only
when a bucket's expiration changes, i.e. once per use of the bucket, not once per task. The reaper sleeps until
the earliest bucket is due, advances every wheel's clock to that bucket's expiration, and flushes the bucket by
re-inserting its entries. Heap work is per bucket (a few dozen at most), never per task.

Costs, n live tasks, m levels (m = 5 covers 53 minutes with the defaults):
  add          O(m) to find the level, O(1) to link; O(log buckets) heap push when a bucket starts a new cycle
  cancel       O(1) unlink
  expiry       O(1) per task per level it moves down; one heap pop per bucket
  memory       one entry per task; the buckets are fixed (wheel_size per level)

Worked example 1: tick 1 ms, 20 buckets, clock at 0
----------------------------------------------------
Levels (numbered from 1, as in Kafka's comment):
  level  tick    covers expirations    bucket expiration
  1      1 ms    [1, 20)               e itself
  2      20 ms   [20, 400)             e rounded down to 20
  3      400 ms  [400, 8000)           e rounded down to 400
Tasks at 2, 8 and 19 ms land in level 1, buckets 2, 8, 19 (expirations 2, 8, 19): three buckets in the queue.
A task at 350 ms lands in level 2, bucket 17 = [340, 360), expiration 340. A task at 450 ms lands in level 3,
bucket 1 = [400, 800), expiration 400. Then:
  t = 340  bucket [340,360) of level 2 expires; wheels advance to 340; 350 is re-inserted: 350 < 340 + 20,
           so it moves to level 1, bucket 350 % 20 = 10, expiration 350.
  t = 350  the task runs.
  t = 400  bucket [400,800) of level 3 expires; wheels advance to 400; 450 is re-inserted: 450 >= 420, so not
           level 1; 450 < 400 + 400, so level 2, bucket 22 % 20 = 2 = [440, 460), expiration 440.
  t = 440  that bucket expires; 450 moves to level 1, bucket 10, expiration 450.
  t = 450  the task runs.

Worked example 2: tick 1, 3 buckets per level, clock at c (a multiple of 9)
---------------------------------------------------------------------------
A bucket expires at the start of its range. Levels and their buckets:
  level  buckets
  1      [c,c]     [c+1,c+1]   [c+2,c+2]
  2      [c,c+2]   [c+3,c+5]   [c+6,c+8]
  3      [c,c+8]   [c+9,c+17]  [c+18,c+26]
At c+1 the buckets [c,c], [c,c+2] and [c,c+8] are behind the clock. Level 1 moves to c+1 and its freed bucket
now stands for [c+3,c+3]; levels 2 and 3 stay at c (they move in steps of 3 and 9):
  1      [c+1,c+1] [c+2,c+2]   [c+3,c+3]
  2      [c,c+2]   [c+3,c+5]   [c+6,c+8]
  3      [c,c+8]   [c+9,c+17]  [c+18,c+26]
At c+2 level 1 moves again; its freed bucket stands for [c+4,c+4]:
  1      [c+2,c+2] [c+3,c+3]   [c+4,c+4]
At c+3 level 1 frees [c+2,c+2] for [c+5,c+5], and level 2 moves to c+3, freeing [c,c+2] for [c+9,c+11]:
  1      [c+3,c+3] [c+4,c+4]   [c+5,c+5]
  2      [c+3,c+5] [c+6,c+8]   [c+9,c+11]
  3      [c,c+8]   [c+9,c+17]  [c+18,c+26]
(The first bucket of an upper level never receives a task: its range is covered by the level below. A
little waste, for much simpler code.)

Single event loop: no add may run while the clock advances, which the loop guarantees for free.
"""
from __future__ import annotations

from coordinator.timer.delay_queue import BucketQueue
from coordinator.timer.task import TaskCounter, TimerTaskEntry, TimerTaskList


class TimingWheel:
    __slots__ = ("tick_ms", "wheel_size", "interval_ms", "buckets", "current_time_ms", "overflow_wheel",
                 "_queue", "_counter")

    def __init__(self, tick_ms: int, wheel_size: int, start_ms: int, queue: BucketQueue,
                 counter: TaskCounter | None = None) -> None:
        if tick_ms < 1 or wheel_size < 2:
            raise ValueError(f"tick_ms must be >= 1 and wheel_size >= 2, got {tick_ms}, {wheel_size}")
        self.tick_ms = tick_ms
        self.wheel_size = wheel_size
        self.interval_ms = tick_ms * wheel_size
        self._counter = counter if counter is not None else TaskCounter()
        self.buckets = [TimerTaskList(self._counter, tick_ms) for _ in range(wheel_size)]
        self.current_time_ms = start_ms - start_ms % tick_ms
        self.overflow_wheel: TimingWheel | None = None
        self._queue = queue

    def add(self, entry: TimerTaskEntry) -> bool:
        """Places the entry in its bucket; False if it is already expired (the caller runs it).

        Like TimerTaskList.add, it first unlinks the entry from any list it is in. This is the hot path of
        every timer reset and every cascade, so the bucket append is inlined.
        """
        if entry.list is not None:
            entry.list.remove(entry)
        expiration_ms = entry.expiration_ms
        if expiration_ms < self.current_time_ms + self.tick_ms:
            return False
        # Climb to the first level whose ring reaches the expiration. Upper levels never see an expired
        # entry: their clock is at most this one's, and their tick is this one's interval.
        wheel = self
        while expiration_ms >= wheel.current_time_ms + wheel.interval_ms:
            wheel = wheel.overflow_wheel or wheel._add_overflow_wheel()
        tick_ms = wheel.tick_ms
        virtual_id = expiration_ms // tick_ms
        bucket = wheel.buckets[virtual_id % wheel.wheel_size]
        tail = bucket.prev
        entry.prev = tail
        entry.next = bucket
        entry.list = bucket
        tail.next = entry
        bucket.prev = entry
        self._counter.value += 1
        # Offer the bucket only when its expiration changes, i.e. it starts a new cycle of the ring.
        bucket_expiration_ms = virtual_id * tick_ms
        if bucket.expiration_ms != bucket_expiration_ms:
            bucket.expiration_ms = bucket_expiration_ms
            wheel._queue.offer(bucket)
        return True

    def advance_clock(self, time_ms: int) -> None:
        """Moves this wheel's clock (and its overflow wheels') to time_ms rounded down to each tick."""
        wheel: TimingWheel | None = self
        while wheel is not None and time_ms >= wheel.current_time_ms + wheel.tick_ms:
            wheel.current_time_ms = time_ms - time_ms % wheel.tick_ms
            time_ms = wheel.current_time_ms
            wheel = wheel.overflow_wheel

    def detach(self, bucket: TimerTaskList) -> None:
        """Puts a fresh bucket in the slot of `bucket` (of this wheel or an overflow wheel): the old one keeps its
        entries, still O(1) to cancel, while the slot serves later ticks."""
        for wheel in self.levels():
            if wheel.tick_ms == bucket.tick_ms:
                wheel.buckets[wheel.buckets.index(bucket)] = TimerTaskList(self._counter, wheel.tick_ms)
                return
        raise ValueError("not a bucket of these wheels")

    def levels(self) -> list[TimingWheel]:
        """This wheel and its overflow wheels, finest first (for tests and debugging)."""
        found = []
        wheel: TimingWheel | None = self
        while wheel is not None:
            found.append(wheel)
            wheel = wheel.overflow_wheel
        return found

    def _add_overflow_wheel(self) -> TimingWheel:
        self.overflow_wheel = TimingWheel(self.interval_ms, self.wheel_size, self.current_time_ms,
                                          self._queue, self._counter)
        return self.overflow_wheel

    def __repr__(self) -> str:
        return (f"TimingWheel(tick_ms={self.tick_ms}, wheel_size={self.wheel_size}, "
                f"current_time_ms={self.current_time_ms})")
