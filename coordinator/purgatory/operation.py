"""DelayedOperation: an operation that completes when its condition holds, or when its timeout expires."""
from __future__ import annotations

from typing import Callable

from coordinator.timer.task import TimerTask


class DelayedCount:
    """How many operations of one purgatory wait in the timer (Kafka's NumDelayedOperations): the purgatory
    counts an operation in when it starts its timeout, the operation counts itself out when it leaves the timer."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0


class DelayedOperation(TimerTask):
    """Subclass and implement `try_complete`, `on_complete` and `on_expiration`.

    `on_complete` runs exactly once, from whichever comes first: `force_complete()` (called by `try_complete`
    when the condition holds, or by anyone who decides the operation is done) or the timer. On timer expiry
    the order is Kafka's: `on_complete()` first, then `on_expiration()`.
    """

    __slots__ = ("_completed", "_delayed_in", "_watch_keys")

    def __init__(self, delay_ms: int) -> None:
        super().__init__(delay_ms)
        self._completed = False
        # The count of the purgatory whose timer holds this operation, until the operation leaves the timer.
        self._delayed_in: DelayedCount | None = None
        self._watch_keys = 0  # under how many keys the purgatory watches it (see try_complete_else_watch)

    def try_complete(self) -> bool:
        """Checks the condition and calls `force_complete()` if it holds; returns what that returned."""
        raise NotImplementedError

    def on_complete(self) -> None:
        raise NotImplementedError

    def on_expiration(self) -> None:
        raise NotImplementedError

    def force_complete(self) -> bool:
        """Completes the operation if nobody did yet: cancels its timer entry and runs `on_complete()`.

        Returns True only for the call that completed it.
        """
        if self._completed:
            return False
        self._completed = True
        self.cancel()
        self.on_complete()
        return True

    @property
    def is_completed(self) -> bool:
        return self._completed

    def run(self) -> None:
        if self.force_complete():
            self.on_expiration()

    def cancel(self) -> None:
        """Removes the operation from the timer without completing it (O(1))."""
        entry = self._entry  # TimerTask.cancel, inlined: this runs on every completion
        if entry is not None and entry.list is not None:
            entry.list.remove(entry)
        delayed = self._delayed_in
        if delayed is not None:
            self._delayed_in = None
            delayed.value -= 1

    def __repr__(self) -> str:
        return f"{type(self).__name__}(delay_ms={self.delay_ms}, completed={self._completed})"


class CallbackOperation(DelayedOperation):
    """A DelayedOperation whose three parts are callables, each given the operation: for code that cannot subclass
    DelayedOperation (a class of interpreted code cannot subclass a compiled one: the tests against the compiled
    build). `try_complete` checks the condition and calls `force_complete()` if it holds, as the method does."""

    __slots__ = ("_try_complete", "_on_complete", "_on_expiration")

    def __init__(self, delay_ms: int, try_complete: Callable[[CallbackOperation], bool],
                 on_complete: Callable[[CallbackOperation], None],
                 on_expiration: Callable[[CallbackOperation], None]) -> None:
        super().__init__(delay_ms)
        self._try_complete = try_complete
        self._on_complete = on_complete
        self._on_expiration = on_expiration

    def try_complete(self) -> bool:
        return self._try_complete(self)

    def on_complete(self) -> None:
        self._on_complete(self)

    def on_expiration(self) -> None:
        self._on_expiration(self)
