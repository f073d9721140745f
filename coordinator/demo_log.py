"""The demo's logging: every log line to a file, and from them the few that tell the story, as short event lines
for the terminal: a member failed (Kafka's own line), a rebalance done (its duration, why, and its trace id for
`coordinator trace`), an ERROR (one line; the file has the rest). WARNINGs are counted by kind for the summary.

Records arrive on any thread (librdkafka's, Jaeger's starter); the terminal side drains them on the event loop.
"""

from __future__ import annotations

import collections
import logging
import re
import textwrap
import threading
import time
from dataclasses import dataclass
from pathlib import Path

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"
# Kafka's lines for a member the coordinator removed: a classic group's, and a consumer group's (KIP-848) fence
_FAILED = re.compile(r"^Member (?P<member>\S+) in group (?P<group>\S+) has failed, removing it from the group$"
                     r"|^\[GroupId \S+\] Member \S+ fenced from the group because ")
_KEY_VALUE = re.compile(r"(\w+)=(\S+)")


@dataclass(frozen=True)
class DemoEvent:
    at: float  # time.time()
    kind: str  # failed, rebalance, records, error
    text: str
    trace_id: str | None = None  # a rebalance's: shown whole when the line has room, else its first 8 digits
    reason: str = ""  # a rebalance's reason category
    took_ms: int | None = None  # a rebalance's duration


class DemoLog(logging.Handler):
    """Installed on the root logger in place of the terminal's handler; `close_log()` puts the terminal's back."""

    def __init__(self, path: Path, traced: bool) -> None:
        super().__init__(logging.DEBUG)
        self.path = path
        self.traced = traced  # rebalances are announced by the tracer's completion line, which has the trace id
        self._file = logging.FileHandler(path, mode="w", encoding="utf-8")
        self._file.setFormatter(logging.Formatter(LOG_FORMAT))
        self._events: collections.deque[DemoEvent] = collections.deque(maxlen=1000)
        self._reasons: dict[str, str] = {}  # group → its rebalance's reason category (one at a time per group)
        self._lock = threading.Lock()
        self.warnings: collections.Counter[str] = collections.Counter()
        self.errors = 0
        self.rebalances: list[DemoEvent] = []
        self._saved: list[logging.Handler] = []
        self._level = logging.NOTSET

    def open_log(self) -> None:
        root = logging.getLogger()
        self._saved, self._level = root.handlers[:], root.level
        root.handlers = [self._file, self]
        if root.level > logging.INFO or root.level == logging.NOTSET:
            root.setLevel(logging.INFO)  # the file has the story's INFO lines even if the terminal asked for less

    def close_log(self) -> None:
        root = logging.getLogger()
        root.handlers = self._saved
        root.setLevel(self._level)
        self._file.close()

    def drain(self) -> list[DemoEvent]:
        events = []
        while self._events:
            events.append(self._events.popleft())
        return events

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
        except Exception:  # a malformed record is the file handler's to report
            return
        if record.levelno >= logging.ERROR:
            self.errors += 1
            self._events.append(DemoEvent(record.created, "error", f"{record.levelname} {record.name}: {text}"))
            return
        if record.levelno >= logging.WARNING:
            fields = dict(_KEY_VALUE.findall(text))
            self.warnings[fields.get("event") or _short_logger(record.name)] += 1
            return
        failed = _FAILED.match(text)
        if failed:
            self._events.append(DemoEvent(record.created, "failed", text))
            return
        if not text.startswith("event=rebalance_"):
            return
        fields = dict(_KEY_VALUE.findall(text))
        event = fields.get("event")
        if event == "rebalance_trace_started":
            with self._lock:
                self._reasons[fields.get("group", "")] = fields.get("reason_category", "")
        elif event == "rebalance_trace_completed" or (event == "rebalance_complete" and not self.traced):
            group, generation = fields.get("group", "?"), fields.get("generation", "?")
            with self._lock:
                reason = self._reasons.pop(group, "")
            took = fields.get("duration_ms", "?")
            trace_id = fields.get("trace_id") if fields.get("trace_id") not in (None, "None") else None
            epochs = f"group epoch {fields['group_epoch']}" if "group_epoch" in fields else f"generation {generation}"
            line = f"↻ {group} {epochs} in {took} ms" + (f", {reason}" if reason else "")
            done = DemoEvent(record.created, "rebalance", line, trace_id, reason,
                             int(took) if took.isdigit() else None)
            self.rebalances.append(done)
            self._events.append(done)


def event_lines(event: DemoEvent, width: int | None) -> list[str]:
    """The event on one line when it fits (a rebalance's trace id shortened to its first 8 digits if need be:
    `coordinator trace` takes either), else wrapped under its time stamp; never wider than `width`."""
    stamp = time.strftime("%H:%M:%S", time.localtime(event.at)) + " "
    mark = {"failed": "✗ ", "error": "! "}.get(event.kind, "")
    first = f"{stamp}{mark}{event.text}"
    if event.trace_id:
        for trace in (event.trace_id, event.trace_id[:8]):
            whole = f"{first} · trace {trace}"
            if width is None or len(whole) <= width:
                return [whole]
        first = f"{first} · trace {event.trace_id[:8]}"
    if width is None or len(first) <= width:
        return [first]
    if event.kind == "error":  # one line: the file has the rest
        return [first[:width - 1] + "…"]
    return textwrap.wrap(first, width, subsequent_indent=" " * (len(stamp) + 2), break_on_hyphens=False)


def _short_logger(name: str) -> str:
    """`coordinator.storage.librdkafka.state-producer-0` → `librdkafka`: one kind for a client's many loggers."""
    return "librdkafka" if ".librdkafka." in name else name.rsplit(".", 1)[-1]
