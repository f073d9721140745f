"""A write's outcome as a future whose listeners run in the very call that settles it.

An asyncio future's done callbacks run a loop turn after it is settled (`call_soon`). A state write's outcome
passes through three futures on its way to the request that waits for it: the producer's (settled as the
transaction's result reaches the loop), the store's (the appender's bookkeeping: tombstones, offsets, errors
mapped) and the runtime's settling of the group's writes, which answers the request. With done callbacks each
hand-over is a loop turn, and at a thousand members a turn of the loop is every request that arrived meanwhile
(milliseconds). `on_settled` listeners run inside `set_result` / `set_exception` / `cancel` instead: the request
is answered in the call that brings the transaction's outcome, after the commit as before (nothing is answered
before its records are durably committed). Awaiting and done callbacks work as for any future.

A listener added to a future that is done already runs a loop turn later, as a done callback would: never inside
the call that adds it (that caller is group logic in the middle of a request)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, TypeVar

log = logging.getLogger("coordinator.storage")

T = TypeVar("T")


class Outcome(asyncio.Future[T]):
    __slots__ = ("_listeners",)

    def __init__(self, *, loop: asyncio.AbstractEventLoop | None = None) -> None:
        super().__init__(loop=loop)
        self._listeners: list[Callable[[Outcome[T]], object]] | None = None

    def on_settled(self, listener: Callable[[Outcome[T]], object]) -> None:
        """`listener(self)` in the call that settles this future (before its done callbacks); a loop turn from
        now if it is done already."""
        if self.done():
            self.get_loop().call_soon(listener, self)
        elif self._listeners is None:
            self._listeners = [listener]
        else:
            self._listeners.append(listener)

    def set_result(self, result: T) -> None:
        super().set_result(result)
        self._notify()

    def set_exception(self, exception: type | BaseException) -> None:
        super().set_exception(exception)
        self._notify()

    def cancel(self, msg: Any | None = None) -> bool:
        cancelled = super().cancel(msg)
        if cancelled:
            self._notify()
        return cancelled

    def _notify(self) -> None:
        listeners, self._listeners = self._listeners, None
        for listener in listeners or ():
            try:
                listener(self)
            except Exception:  # our bug: the others still hear of it, and whoever settled it goes on
                log.exception("event=outcome_listener_failed")


def when_settled(future: asyncio.Future[Any], listener: Callable[[Any], object]) -> None:
    """`listener(future)` as an Outcome's listener if it is one (in the settling call), else as a done callback."""
    if isinstance(future, Outcome):
        future.on_settled(listener)
    else:
        future.add_done_callback(listener)
