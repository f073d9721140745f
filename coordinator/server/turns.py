"""A budget of requests handled per event-loop turn, shared by every connection on the loop.

asyncio and uvloop run, in one turn, every socket callback that is ready; what was scheduled meanwhile (a state
write's acknowledgement handed over with `call_soon_threadsafe`, a due timer, a parked member's answer) runs only
in the next turn. Without a bound, a flood of requests that arrived together (the SyncGroups of a 1,000-member
rebalance, a client's pipelined frames) is handled to the last one first, and the turn grows with the flood.

Here, once the turn's budget is spent, a connection leaves its further frames in its buffer and queues itself; the
next turn starts with the queue (in order, again up to the budget), ahead of that turn's new reads, and the
callbacks scheduled during the flood run in between.
"""

from __future__ import annotations

import asyncio
import weakref
from collections import deque
from typing import Protocol

REQUESTS_PER_TURN = 64  # a heartbeat costs ~10 µs, a follower's SyncGroup ~30–150 µs: a turn of a few ms at most


class Resumable(Protocol):
    def continue_frames(self) -> None: ...


class TurnBudget:
    def __init__(self, loop: asyncio.AbstractEventLoop, per_turn: int = REQUESTS_PER_TURN) -> None:
        if per_turn < 1:
            raise ValueError("per_turn must be positive")
        self.per_turn = per_turn
        self.left = per_turn  # requests this turn may still handle
        self._loop = weakref.ref(loop)  # weak: the loop is this budget's key in _BUDGETS
        self._refill_due = False
        self._waiting: deque[Resumable] = deque()

    def spend(self) -> None:
        """One request handled; the first of a turn schedules the next turn's refill."""
        self.left -= 1
        if not self._refill_due:
            self._refill_due = True
            loop = self._loop()
            if loop is not None:
                loop.call_soon(self._next_turn)

    def wait(self, connection: Resumable) -> None:
        """`connection` has frames left over: it carries on in a later turn (the caller queues it once)."""
        self._waiting.append(connection)

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
