"""The delay queue of buckets: a heap keyed by bucket expiration.

Only buckets enter it, and only when a bucket's expiration changes (once per wheel cycle), so its size is
bounded by the number of buckets, not tasks: a million timers in 20-slot wheels push at most a few dozen
buckets. This is what lets the reaper sleep until the next bucket is due instead of ticking every millisecond.
"""
from __future__ import annotations

import heapq
import itertools
from typing import Callable

from coordinator.timer.task import TimerTaskList


class BucketQueue:
    __slots__ = ("_heap", "_sequence", "on_earliest_changed")

    def __init__(self, on_earliest_changed: Callable[[int], object] | None = None) -> None:
        # (expiration_ms, sequence, bucket): the sequence breaks ties so buckets are never compared.
        self._heap: list[tuple[int, int, TimerTaskList]] = []
        self._sequence = itertools.count()
        # Called with the new earliest expiration when an offer moves it earlier: the reaper re-arms its wake-up.
        self.on_earliest_changed = on_earliest_changed

    def offer(self, bucket: TimerTaskList) -> None:
        expiration_ms = bucket.expiration_ms
        heap = self._heap
        is_earliest = not heap or expiration_ms < heap[0][0]
        heapq.heappush(heap, (expiration_ms, next(self._sequence), bucket))
        if is_earliest and self.on_earliest_changed is not None:
            self.on_earliest_changed(expiration_ms)

    def earliest_ms(self) -> int | None:
        return self._heap[0][0] if self._heap else None

    def poll(self, now_ms: int) -> TimerTaskList | None:
        """The earliest bucket whose expiration is <= now_ms, removed from the queue; else None."""
        heap = self._heap
        while heap and heap[0][0] <= now_ms:
            expiration_ms, _, bucket = heapq.heappop(heap)
            # A bucket's expiration only changes after it was flushed, so a mismatch is never expected;
            # skipping it (its current expiration has its own heap entry) keeps the queue safe regardless.
            if bucket.expiration_ms == expiration_ms:
                return bucket
        return None

    def clear(self) -> None:
        self._heap.clear()

    def __len__(self) -> int:
        return len(self._heap)
