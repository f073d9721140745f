"""A budget of requests handled per event-loop turn, shared by every connection on the loop.

asyncio and uvloop run, in one turn, every socket callback that is ready; what was scheduled meanwhile (a state
write's acknowledgement handed over with `call_soon_threadsafe`, a due timer, a parked member's answer) runs only
in the next turn. Without a bound, a flood of requests that arrived together (the SyncGroups of a 1,000-member
rebalance, a client's pipelined frames) is handled to the last one first, and the turn grows with the flood.

Here, once the turn's budget is spent, a connection leaves its further frames in its buffer and queues itself; the
next turn starts with the queue (in order, again up to the budget), ahead of that turn's new reads, and the
callbacks scheduled during the flood run in between. A side effect worth knowing: a request that arrived before a
timer's deadline may now be handled after the timer fired (a group's initial-delay window closes without a member
whose JoinGroup waited here), as in Kafka, where requests wait in the request queue while the purgatory expires.
"""

from __future__ import annotations

import asyncio
import weakref
from collections import deque
from typing import Protocol

# The budget is in units of a heartbeat on its fast path; any other request (a JoinGroup, a SyncGroup: 30–150 µs)
# costs REQUEST_UNITS. A heartbeat's fast path is ~6–10 µs of Python, but what the loop spends per heartbeat with its
# read, its write and the loop's own dispatch is ~25 µs (the soak at 100k members on uvloop; more on asyncio): a turn of
# 256 heartbeats or 32 other requests is ~7 ms. The loop probe's busy stretch spans about two turns when the loop
# is saturated (its tick runs after the I/O callbacks of a turn): with 512, stretches of 20–38 ms in the 100k-member
# soak on uvloop, with 256 10–15 ms at the same CPU per heartbeat (docs/performance.md, 2026-11-28); heartbeats of
# a few hundred connections are still not split over turns for nothing. The budget bounds the answers, not the
# reads: on asyncio the service's loop takes at most EVENTS_PER_POLL ready connections a turn (server/event_loop.py);
# uvloop takes up to 1,024 a poll. A steady
# ConsumerGroupHeartbeat answered from its frame costs 2.8–4.3 times a Heartbeat's fast path
# (bench.consumer_heartbeat_path, with and without --classic): 4 units; one the general path serves costs
# REQUEST_UNITS.
UNITS_PER_TURN = 256
HEARTBEAT_UNITS = 1
STEADY_CONSUMER_GROUP_HEARTBEAT_UNITS = 4
REQUEST_UNITS = 8


class Resumable(Protocol):
    def continue_frames(self) -> None: ...


class TurnBudget:
    def __init__(self, loop: asyncio.AbstractEventLoop, per_turn: int = UNITS_PER_TURN) -> None:
        if per_turn < 1:
            raise ValueError("per_turn must be positive")
        self.per_turn = per_turn
        self.left = per_turn  # units this turn may still spend
        self._loop = weakref.ref(loop)  # weak: the loop is this budget's key in _BUDGETS
        self._refill_due = False
        self._refill_below = per_turn // 2  # spent down to this: the next turn refills
        self._waiting: deque[Resumable] = deque()

    def spend(self, units: int) -> None:
        """A request handled; once half the budget is spent, the next turn refills it. Not every turn: a
        callback per turn would cost a loop callback (and an extra poll of the loop) per request when requests
        arrive one per turn, as heartbeats of many connections do; every turn still starts with more than half
        the budget and never more than all of it."""
        self.left -= units
        if self.left <= self._refill_below and not self._refill_due:
            self._schedule_refill()

    def _schedule_refill(self) -> None:
        self._refill_due = True
        loop = self._loop()
        if loop is not None:
            loop.call_soon(self._next_turn)

    def wait(self, connection: Resumable, *, first: bool = False) -> None:
        """`connection` has frames left over: it carries on in a later turn (the caller queues it once). `first`:
        ahead of the connections already waiting (a group leader's SyncGroup, which the others' answers wait for:
        requests of different connections have no order to keep, a connection's own frames keep theirs)."""
        if first:
            self._waiting.appendleft(connection)
        else:
            self._waiting.append(connection)
        if not self._refill_due:  # (spent already: a connection waits only once the budget is gone)
            self._schedule_refill()

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def _next_turn(self) -> None:
        self._refill_due = False
        self.left = self.per_turn
        waiting = self._waiting
        while waiting and self.left > 0:
            waiting.popleft().continue_frames()  # spends from this turn's budget, or queues itself again


_BUDGETS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, TurnBudget] = weakref.WeakKeyDictionary()


def turn_budget(loop: asyncio.AbstractEventLoop | None = None) -> TurnBudget:
    """The budget of `loop` (the running one by default), made on first use."""
    loop = loop or asyncio.get_running_loop()
    budget = _BUDGETS.get(loop)
    if budget is None:
        budget = _BUDGETS[loop] = TurnBudget(loop)
    return budget
