"""asyncio's loop for the service, with at most `EVENTS_PER_POLL` ready descriptors taken per loop turn.

asyncio's selector loop asks epoll for every ready descriptor (`maxevents` is the number registered) and runs a
callback for each in the same turn. The turn budget (server/turns.py) bounds what those reads answer, not the
reads: a server the machine did not schedule for 100 ms finds 700–1,700 of 3,334 connections readable and reads
them all in one turn (~10 µs a read that only queues its frames for a later turn, ~30 µs one that answers), a busy
stretch that grows with the connections ready (docs/performance.md, 2026-11-28). Here epoll is asked for at most
`EVENTS_PER_POLL` at a time. asyncio registers descriptors level-triggered: one not taken this turn is still
ready, and the kernel hands the ready list out in turn (a level-triggered descriptor just reported goes to the
list's tail, behind those not reported yet), so every connection is read within a few turns and none starves.

uvloop (libuv) takes up to 1,024 events per `epoll_wait`; it is not changed here.
"""

from __future__ import annotations

import asyncio
import math
import select
import selectors
from typing import Any

# 128 reads that only queue are ~1.3 ms on asyncio, 128 that answer ~4 ms; what they answer is bounded by the turn
# budget as well. A loop turn then costs one more epoll_wait per 128 ready connections: a few µs.
EVENTS_PER_POLL = 128


if hasattr(selectors, "EpollSelector"):

    class BoundedEpollSelector(selectors.EpollSelector):
        """`EpollSelector` whose `select` returns at most `max_events` ready descriptors (CPython 3.11's select,
        with `maxevents` capped)."""

        def __init__(self, max_events: int = EVENTS_PER_POLL) -> None:
            if max_events < 1:
                raise ValueError("max_events must be positive")
            super().__init__()
            self.max_events = max_events

        def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
            if timeout is None:
                timeout = -1
            elif timeout <= 0:
                timeout = 0
            else:  # epoll_wait() counts milliseconds: round up, to wait at least `timeout`
                timeout = math.ceil(timeout * 1e3) * 1e-3
            max_ev = max(min(len(self._fd_to_key), self.max_events), 1)  # type: ignore[attr-defined]
            ready: list[tuple[selectors.SelectorKey, int]] = []
            try:
                fd_event_list = self._selector.poll(timeout, max_ev)  # type: ignore[attr-defined]
            except InterruptedError:
                return ready
            fd_to_key = self._fd_to_key  # type: ignore[attr-defined]
            for fd, event in fd_event_list:
                events = 0
                if event & ~select.EPOLLIN:
                    events |= selectors.EVENT_WRITE
                if event & ~select.EPOLLOUT:
                    events |= selectors.EVENT_READ
                key = fd_to_key.get(fd)
                if key:
                    ready.append((key, events & key.events))
            return ready


def new_event_loop(events_per_poll: int = EVENTS_PER_POLL) -> asyncio.AbstractEventLoop:
    """asyncio's selector loop taking at most `events_per_poll` ready descriptors a turn (where epoll exists;
    elsewhere asyncio's default loop)."""
    if hasattr(selectors, "EpollSelector"):
        return asyncio.SelectorEventLoop(BoundedEpollSelector(events_per_poll))
    return asyncio.new_event_loop()


def run(coro: Any) -> Any:
    """`asyncio.run(coro)` on the loop above."""
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(coro)
