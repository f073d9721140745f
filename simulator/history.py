"""The history of one simulated run: every event in order, with its virtual time, hashed as it grows.

Events are `(seq, t_ms, kind, fields)` with plain data in `fields` (ints, strings, tuples: nothing whose repr
depends on the process), so the same seed gives the same history and the same hash in every process (the CLI
fixes PYTHONHASHSEED, on which the iteration order of string sets depends). Checkers subscribe and see each
event as it is recorded; the trace of a failing seed is this list, printed.
"""
from __future__ import annotations

import hashlib
from typing import Any, Callable, NamedTuple


class Event(NamedTuple):
    seq: int
    t_ms: int
    kind: str
    fields: dict[str, Any]

    def line(self) -> str:
        detail = " ".join(f"{name}={value}" for name, value in self.fields.items())
        return f"{self.seq:>7} {self.t_ms / 1000:>10.3f}s {self.kind:<18} {detail}"


class History:
    def __init__(self, now_ms: Callable[[], int], keep: bool = True) -> None:
        self._now_ms = now_ms
        self._keep = keep
        self.events: list[Event] = []
        self.count = 0
        self._hash = hashlib.blake2b(digest_size=16)
        self._unhashed: list[str] = []  # lines not hashed yet: hashed together (the same digest, fewer calls)
        self._listeners: dict[str, list[Callable[[Event], None]]] = {}  # by the kind of event they are told
        self._closed = False

    def listen(self, kinds: tuple[str, ...], listener: Callable[[Event], None]) -> None:
        """`listener` is told each event of these kinds as it is recorded."""
        for kind in kinds:
            self._listeners.setdefault(kind, []).append(listener)

    def close(self) -> None:
        """The run is over: nothing more is recorded (nor hashed, nor checked)."""
        self._closed = True
        self._listeners = {}

    def record(self, kind: str, /, **fields: Any) -> None:
        if self._closed:
            return
        t_ms = self._now_ms()
        seq = self.count
        self.count = seq + 1
        unhashed = self._unhashed
        unhashed.append(f"{t_ms}|{kind}|{fields!r}\n")
        if len(unhashed) >= 256:
            self._hash_lines()
        listeners = self._listeners.get(kind)
        if self._keep or listeners:  # the Event only for whom it is for
            event = Event(seq, t_ms, kind, fields)
            if self._keep:
                self.events.append(event)
            for listener in listeners or ():
                listener(event)

    def _hash_lines(self) -> None:
        self._hash.update("".join(self._unhashed).encode())
        self._unhashed.clear()

    @property
    def digest(self) -> str:
        self._hash_lines()
        return self._hash.hexdigest()

    def trace(self, last: int | None = None) -> str:
        events = self.events if last is None else self.events[-last:]
        return "\n".join(event.line() for event in events)
