"""Timer tasks, their entries, and the bucket (`TimerTaskList`) that holds entries.

A bucket is a circular doubly linked list whose sentinel is the bucket itself, so adding and removing an
entry are O(1) and an entry knows its bucket: cancelling a task unlinks it at once, leaving no garbage behind
(a heap-based timer keeps cancelled handles until they reach the top or the heap is compacted).

`entry.list` tells where an entry is:
  a TimerTaskList   scheduled in that bucket (counted in the timer's size)
  PENDING_RUN       expired and handed to the executor, `run()` not called yet
  None              idle: never added, cancelled, or already run
Single event loop, so no locks: nothing else can touch a bucket while it is being changed.

An entry holds its task only while it is scheduled (in a bucket or PENDING_RUN): the task keeps its entry for
reuse, and the entry's reference back would otherwise make every task that ever ran a reference cycle, which
only the cyclic collector can free (coordinator/runtime_health.py keeps long-lived objects out of its reach).
"""
from __future__ import annotations

from typing import Callable


class TaskCounter:
    """Number of entries in buckets, shared by every bucket of one timer (the timer's `size`)."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0


class TimerTask:
    """Something to run once after `delay_ms`: subclass and override `run()`.

    A task owns at most one entry and reuses it: adding the task again reschedules it (the old schedule is
    dropped, including a run that was already handed to the executor but has not happened yet).
    """

    __slots__ = ("delay_ms", "_entry")

    # A task whose due time can move later without the timer being told (a session deadline that every heartbeat
    # pushes back) sets this and answers `postponed_ms`: the timer asks it each time it moves the task's entry to
    # a finer wheel, so the entry follows the moved deadline in the coarse wheels instead of cascading down to
    # its first expiration, running, and being added again for the rest.
    postponable = False

    def __init__(self, delay_ms: int) -> None:
        self.delay_ms = delay_ms
        self._entry: TimerTaskEntry | None = None

    def run(self) -> None:
        raise NotImplementedError

    def postponed_ms(self, expiration_ms: int) -> int:
        """A `postponable` task's expiration as of now, given the one it was scheduled for; an earlier value is
        ignored (a task never runs before its scheduled expiration)."""
        return expiration_ms

    def cancel(self) -> None:
        """Stop the task from running; O(1). Harmless if it is not scheduled."""
        entry = self._entry
        if entry is not None and entry.list is not None:
            entry.list.remove(entry)

    @property
    def is_scheduled(self) -> bool:
        """True while the task waits in the timer or its run is pending on the executor."""
        entry = self._entry
        return entry is not None and entry.list is not None

    @property
    def expiration_ms(self) -> int | None:
        entry = self._entry
        return None if entry is None or entry.list is None else entry.expiration_ms


class CallbackTask(TimerTask):
    """A task that runs `callback()`: for code that cannot subclass TimerTask (a class of interpreted code cannot
    subclass a compiled one: the tests and their helpers against the compiled build, coordinator/timer/testing.py)."""

    __slots__ = ("callback",)

    def __init__(self, delay_ms: int, callback: Callable[[], None]) -> None:
        super().__init__(delay_ms)
        self.callback = callback

    def run(self) -> None:
        self.callback()


class TimerTaskEntry:
    """Links a task into a bucket; `expiration_ms` is absolute on the timer's clock."""

    __slots__ = ("task", "expiration_ms", "list", "next", "prev")

    def __init__(self, task: TimerTask, expiration_ms: int) -> None:
        self.task: TimerTask | None = task  # None while idle (see the module docstring)
        self.expiration_ms = expiration_ms
        self.list: TimerTaskList | _PendingRun | None = None
        self.next: TimerTaskEntry | TimerTaskList | None = None
        self.prev: TimerTaskEntry | TimerTaskList | None = None

    def run_if_due(self) -> None:
        """What the executor calls: runs the task unless it was cancelled or rescheduled meanwhile."""
        task = self.task
        if self.list is PENDING_RUN and task is not None:  # a pending entry always holds its task
            self.task = self.list = None
            task.run()

    def __repr__(self) -> str:
        return f"TimerTaskEntry({self.task!r}, expiration_ms={self.expiration_ms})"


class _PendingRun:
    """Marks entries handed to the executor; `remove` makes the pending run a no-op (cancel/reschedule)."""

    __slots__ = ()

    def remove(self, entry: TimerTaskEntry) -> None:
        entry.list = entry.task = None

    def __repr__(self) -> str:
        return "PENDING_RUN"


PENDING_RUN = _PendingRun()


class TimerTaskList:
    """A bucket: entries that expire in the same tick of one wheel; `expiration_ms` is -1 while unused."""

    __slots__ = ("next", "prev", "expiration_ms", "tick_ms", "_counter")

    def __init__(self, counter: TaskCounter, tick_ms: int = 0) -> None:
        self.next: TimerTaskEntry | TimerTaskList = self
        self.prev: TimerTaskEntry | TimerTaskList = self
        self.expiration_ms = -1
        self.tick_ms = tick_ms  # of its wheel: the bucket is reused for a later tick once the clock passes this one
        self._counter = counter

    def set_expiration(self, expiration_ms: int) -> bool:
        """Returns True if the expiration changed, i.e. the bucket must be (re)offered to the delay queue."""
        if self.expiration_ms == expiration_ms:
            return False
        self.expiration_ms = expiration_ms
        return True

    def add(self, entry: TimerTaskEntry) -> None:
        if entry.list is not None:
            entry.list.remove(entry)
        tail = self.prev
        entry.prev = tail
        entry.next = self
        entry.list = self
        tail.next = entry
        self.prev = entry
        self._counter.value += 1

    def remove(self, entry: TimerTaskEntry) -> None:
        if entry.list is not self:
            return
        prev, nxt = entry.prev, entry.next
        assert prev is not None and nxt is not None  # an entry in a list has both neighbours
        prev.next = nxt
        nxt.prev = prev
        entry.next = entry.prev = entry.list = entry.task = None
        self._counter.value -= 1

    def flush(self, reinsert: Callable[[TimerTaskEntry], object]) -> None:
        """Removes every entry, hands each to `reinsert`, and marks the bucket unused.

        The chain is detached first, so even a reinsert into this very bucket could not loop forever.
        """
        entry: TimerTaskEntry | TimerTaskList | None = self.next
        self.next = self.prev = self
        self.expiration_ms = -1
        counter = self._counter
        while isinstance(entry, TimerTaskEntry):  # the ring's only other node is this list, its sentinel
            following = entry.next
            entry.next = entry.prev = entry.list = None
            counter.value -= 1
            reinsert(entry)
            entry = following

    def flush_some(self, reinsert: Callable[[TimerTaskEntry], object], limit: int) -> int:
        """Hands up to `limit` entries from the head to `reinsert`; returns how many. The ones left stay linked
        here, so cancelling or rescheduling them meanwhile stays O(1)."""
        counter = self._counter
        handed = 0
        while handed < limit:
            entry = self.next
            if not isinstance(entry, TimerTaskEntry):
                break
            following = entry.next
            assert following is not None
            self.next = following
            following.prev = self
            entry.next = entry.prev = entry.list = None
            counter.value -= 1
            handed += 1
            reinsert(entry)
        return handed

    @property
    def is_empty(self) -> bool:
        return self.next is self

    def entries(self) -> list[TimerTaskEntry]:
        """A snapshot, for tests and debugging."""
        found = []
        entry: TimerTaskEntry | TimerTaskList | None = self.next
        while isinstance(entry, TimerTaskEntry):
            found.append(entry)
            entry = entry.next
        return found

    def __len__(self) -> int:
        return len(self.entries())

    def __repr__(self) -> str:
        return f"TimerTaskList(expiration_ms={self.expiration_ms}, entries={len(self)})"
