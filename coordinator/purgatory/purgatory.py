"""DelayedOperationPurgatory: delayed operations watched under keys, with a timer for their timeouts.

Kafka shards its watcher map 512 ways and takes locks; one event loop owns everything here, so a plain dict
of key -> list of operations does, and "try, watch, try again" needs no lock: nothing can complete the
operation between the two tries except the code those tries run themselves.

Purging. An operation completed through one key stays in the watcher lists of its other keys until those keys
are checked. Kafka counts operations as they are watched (`estimated_total`) and, when that count exceeds the
operations still pending in the timer by more than `purge_interval`, sweeps every watcher list. The sweep
costs O(watcher entries); to keep it amortised O(1) per operation even when many operations are pending (say
100k heartbeats, where a sweep every 1000 completions would cost 100 entries per completion), we also require
the completed estimate to exceed the pending count: then each sweep visits at most ~2 × keys entries per
operation it can drop. The check runs after each `try_complete_else_watch` (the only place the lists grow).
Kafka sweeps on its expiration reaper's thread; here the sweep runs on the loop, so on a running loop it goes
PURGE_BATCH keys per loop callback (a sweep over 300k members' keys in one go held the loop ~120-140 ms): the keys
are those present when it starts; a key's list is read again as the sweep reaches it.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Generic, Hashable, Sequence, TypeVar

from coordinator.purgatory.operation import DelayedCount, DelayedOperation
from coordinator.timer.system_timer import SystemTimer

log = logging.getLogger(__name__)

T = TypeVar("T", bound=DelayedOperation)

# Watcher keys swept per loop callback: ~0.5-1.3 µs a key (300k members' heartbeat keys: 121.8 ms in one callback
# of the 300k-member soak, 2026-11-29), so ~1-3 ms a callback.
PURGE_BATCH = 2048


class DelayedOperationPurgatory(Generic[T]):
    def __init__(self, name: str, timer: SystemTimer, purge_interval: int = 1000, *,
                 owns_timer: bool = True) -> None:
        """`owns_timer`: whether `shutdown()` closes the timer (Kafka gives each purgatory its own timer;
        pass False when several purgatories share one)."""
        self.name = name
        self.timer = timer
        self.purge_interval = purge_interval
        self._owns_timer = owns_timer
        self._watchers: dict[Hashable, list[T]] = {}
        self._watched = 0            # entries over all watcher lists, completed ones included
        self._estimated_total = 0    # operations watched since the last purge, plus those pending then
        self._delayed = DelayedCount()  # this purgatory's operations in the timer (they count themselves out)
        self._sweep: list[Hashable] = []  # the keys a sweep on the loop has still to visit (`_purge`)
        self._sweep_handle: asyncio.Handle | None = None
        # sweeps over every key started (`purge_completed`, or one a batch of keys per loop callback) and the
        # watcher-list entries there were when each started: what the purge costs (tests)
        self.sweeps = 0
        self.swept_entries = 0

    @property
    def watched(self) -> int:
        """Kafka's PurgatorySize: watcher-list entries, including completed operations not yet purged."""
        return self._watched

    @property
    def delayed(self) -> int:
        """Kafka's NumDelayedOperations: this purgatory's operations still waiting in the timer.

        Counted per purgatory, so it stays right when one timer is shared (then it is not timer.size).
        """
        return self._delayed.value

    def try_complete_else_watch(self, op: T, keys: Sequence[Hashable]) -> bool:
        """Completes `op` now if it can; otherwise watches it under every key and starts its timeout.

        Returns True if `op` completed during this call. Tries once before watching (cheap path) and once
        after (the condition may have become true while it was being registered, e.g. by a callback).
        """
        if not keys:
            raise ValueError("the keys of a delayed operation must not be empty")
        if op.try_complete():
            return True
        watchers = self._watchers
        op._watch_keys = len(keys)
        for key in keys:
            ops = watchers.get(key)
            if ops is None:
                watchers[key] = [op]
            else:
                if ops[0]._completed or ops[-1]._completed:
                    self._compact(ops)
                ops.append(op)
        self._watched += len(keys)
        self._estimated_total += 1
        if op.try_complete():
            return True
        if not op._completed:
            op._delayed_in = self._delayed
            self._delayed.value += 1
            self.timer.add(op)
        # The purge check (inlined _maybe_purge): the watcher lists only grow here.
        delayed = self._delayed.value
        completed_estimate = self._estimated_total - delayed
        if completed_estimate > self.purge_interval and completed_estimate > delayed:
            self._purge()
        return False

    def rearm(self, op: T, key: Hashable) -> None:
        """Starts `op`'s timeout again (`op.delay_ms` from now) after its timer completed it, still watched under
        `key`, its only key: the same operation and timer entry serve the next timeout, so a session re-armed
        once per timeout allocates nothing. The caller has checked the condition (it does not hold)."""
        if not op._completed or op._watch_keys != 1:
            raise ValueError("only a completed operation watched under one key is re-armed")
        op._completed = False
        ops = self._watchers.get(key)
        if ops is None or not any(watched is op for watched in ops):  # dropped from the list since it completed
            if ops is None:
                self._watchers[key] = [op]
            else:
                ops.append(op)
            self._watched += 1
            self._estimated_total += 1
        op._delayed_in = self._delayed
        self._delayed.value += 1
        self.timer.add(op)

    def _compact(self, ops: list[T]) -> None:
        """Drops completed operations from one key's list as a new one joins it. A session's heartbeat
        operation is re-armed under the same key once per session: without this its completed predecessors
        would wait for `_purge`, whose sweep over every key (300k members: ~150 ms) holds the loop. An
        operation watched under this key only has now left the purgatory, so it leaves the estimate too."""
        live = [o for o in ops if not o._completed]
        gone = [o for o in ops if o._completed and o._watch_keys == 1]
        self._watched -= len(ops) - len(live)
        self._estimated_total -= len(gone)
        ops[:] = live

    def check_and_complete(self, key: Hashable) -> int:
        """Tries to complete every operation watched under `key`; returns how many completed.

        Completed operations leave the key's list; a key whose list empties is removed.
        """
        ops = self._watchers.pop(key, None)
        if ops is None:
            return 0
        # The list is detached while callbacks run, so operations they watch under the same key go into a
        # fresh list instead of the one being walked; survivors are merged back afterwards.
        completed = 0
        survivors: list[T] = []
        for op in ops:
            if op._completed:
                continue
            if op.try_complete():
                completed += 1
            else:
                survivors.append(op)
        self._watched -= len(ops) - len(survivors)
        if survivors:
            current = self._watchers.get(key)
            if current is None:
                self._watchers[key] = survivors
            else:
                current.extend(survivors)
        return completed

    def cancel_for_key(self, key: Hashable) -> list[T]:
        """Stops watching `key`; cancels (does not complete) its operations and returns them."""
        ops = self._watchers.pop(key, None)
        if ops is None:
            return []
        self._watched -= len(ops)
        for op in ops:
            op.cancel()
        return ops

    def watched_under(self, key: Hashable) -> int:
        """Entries under one key (completed ones included until they are dropped)."""
        ops = self._watchers.get(key)
        return 0 if ops is None else len(ops)

    def purge_completed(self) -> int:
        """Drops completed operations from every watcher list; returns how many entries were dropped."""
        self._count_sweep()
        dropped = self._drop_completed(list(self._watchers))
        self._estimated_total = self._delayed.value
        return dropped

    def _count_sweep(self) -> None:
        self.sweeps += 1
        self.swept_entries += self._watched

    def _drop_completed(self, keys: list[Hashable]) -> int:
        """Completed operations dropped from these keys' lists (a key gone meanwhile is skipped: its operations
        all completed through it, check_and_complete); returns how many entries were dropped."""
        dropped = 0
        watchers = self._watchers
        for key in keys:
            ops = watchers.get(key)
            if ops is None:
                continue
            live = [op for op in ops if not op.is_completed]
            if len(live) != len(ops):
                dropped += len(ops) - len(live)
                if live:
                    watchers[key] = live
                else:
                    del watchers[key]
        self._watched -= dropped
        return dropped

    async def shutdown(self) -> None:
        """Cancels every watched operation and, if it owns the timer, closes it."""
        self._stop_sweep()
        for key in list(self._watchers):
            self.cancel_for_key(key)
        if self._owns_timer:
            await self.timer.close()

    def _purge(self) -> None:
        """The sweep Kafka's estimate asks for: at once off the loop or when the keys fit one batch, else
        PURGE_BATCH keys per loop callback. The estimate restarts now (from the operations still pending), so no
        second sweep starts while this one goes."""
        if self._sweep_handle is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is None or len(self._watchers) <= PURGE_BATCH:
            self._log_purged(self.purge_completed())
            return
        self._count_sweep()
        self._estimated_total = self._delayed.value
        self._sweep = list(self._watchers)
        self._sweep_handle = loop.call_soon(self._sweep_some, 0)

    def _sweep_some(self, dropped: int) -> None:
        """One batch of a sweep: completed operations dropped from the next PURGE_BATCH keys' lists."""
        keys = self._sweep
        batch = keys[-PURGE_BATCH:]
        del keys[-PURGE_BATCH:]
        dropped += self._drop_completed(batch)
        if keys:
            self._sweep_handle = asyncio.get_running_loop().call_soon(self._sweep_some, dropped)
            return
        self._sweep_handle = None
        self._log_purged(dropped)

    def _log_purged(self, dropped: int) -> None:
        log.debug("purgatory=%s purged=%d watched=%d delayed=%d", self.name, dropped, self._watched,
                  self._delayed.value)

    def _stop_sweep(self) -> None:
        if self._sweep_handle is not None:
            self._sweep_handle.cancel()
            self._sweep_handle = None
        self._sweep = []

    def __repr__(self) -> str:
        return (f"DelayedOperationPurgatory(name={self.name!r}, watched={self._watched}, "
                f"delayed={self._delayed.value})")
