"""Rebalance traces read back from Jaeger's query API (`/api/traces`, the JSON Jaeger's own UI reads) into a small
model that `coordinator trace` draws in the terminal (coordinator/telemetry/trace_render.py).

A rebalance is one trace (docs/tracing.md): a root `rebalance` span, its `join phase` and `sync phase`, one
`JoinGroup wait <member>` / `SyncGroup wait <member>` per member and the `state-topic write`; events (`member
failed`, `state change`, ...) sit on the root. Any Jaeger holding the coordinator's spans works: the one
`coordinator jaeger` or the demo runs, or a production one.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from coordinator.state_dir import default_state_dir

ROOT_NAME = "rebalance"
GROUP_KEY = "messaging.consumer.group.name"
MEMBER_KEY = "coordinator.member.id"
CLIENT_KEY = "messaging.client.id"
WAIT_PREFIXES = ("JoinGroup wait ", "SyncGroup wait ")
PROTOCOL_KEY = "coordinator.group.protocol"  # "consumer" on a consumer group's (KIP-848) rebalance
RECONCILE_PREFIX = "reconcile "  # a consumer group member's span: the target computed → its epoch reached
JAEGER_URL_FILE = "jaeger-url"  # in the demo's state directory while its Jaeger runs
SAVED_TRACES_FILE = "traces.json"  # in the demo's state directory: the traces it saved when it stopped


class TraceSourceError(RuntimeError):
    """Jaeger could not be asked, or answered something that is not Jaeger's trace JSON."""


@dataclass(frozen=True)
class SpanEvent:
    at_us: int  # absolute, microseconds since the epoch
    name: str
    fields: dict[str, Any]


@dataclass
class SpanView:
    span_id: str
    name: str
    start_us: int
    duration_us: int
    tags: dict[str, Any]
    events: list[SpanEvent]
    parent_id: str | None
    children: list[SpanView] = field(default_factory=list)

    @property
    def end_us(self) -> int:
        return self.start_us + self.duration_us

    @property
    def failed(self) -> bool:
        return self.tags.get("otel.status_code") == "ERROR" or self.tags.get("error") is True

    @property
    def status_text(self) -> str | None:
        text = self.tags.get("otel.status_description")
        return str(text) if text else None

    @property
    def member_id(self) -> str | None:
        value = self.tags.get(MEMBER_KEY)
        return str(value) if value is not None else None


@dataclass
class Rebalance:
    """One rebalance trace: the root span with its tree, plus what the header says."""

    trace_id: str
    root: SpanView
    linked_trace_ids: list[str]  # previous / superseded rebalance, the request that started it

    @property
    def group(self) -> str:
        return str(self.root.tags.get(GROUP_KEY, "?"))

    @property
    def start_us(self) -> int:
        return self.root.start_us

    @property
    def duration_us(self) -> int:
        return self.root.duration_us

    def tag(self, key: str) -> Any:
        return self.root.tags.get(key)

    def spans(self) -> Iterable[SpanView]:
        stack = [self.root]
        while stack:
            span = stack.pop()
            yield span
            stack.extend(reversed(span.children))

    def failures(self) -> list[SpanEvent]:
        return [event for event in self.root.events if event.name == "member failed"]


def rebalances_from_jaeger_json(document: Any) -> list[Rebalance]:
    """Every rebalance trace in a Jaeger `/api/traces` answer (`{"data": [trace, ...]}`), oldest first. Traces
    that are not rebalances (LeaveGroup, OffsetCommit request spans) are left out."""
    if not isinstance(document, dict) or not isinstance(document.get("data"), list):
        raise TraceSourceError("not Jaeger's trace JSON (expected an object with a 'data' list)")
    found = [r for r in (_rebalance(trace) for trace in document["data"] if isinstance(trace, dict)) if r]
    return sorted(found, key=lambda r: r.start_us)


def _rebalance(trace: dict[str, Any]) -> Rebalance | None:
    spans: dict[str, SpanView] = {}
    links: list[str] = []
    trace_id = str(trace.get("traceID", "")).lower()
    for raw in trace.get("spans") or []:
        parent = None
        for ref in raw.get("references") or []:
            if ref.get("refType") == "CHILD_OF" and str(ref.get("traceID", "")).lower() == trace_id:
                parent = str(ref.get("spanID"))
            elif str(ref.get("traceID", "")).lower() not in ("", trace_id):
                links.append(str(ref["traceID"]).lower())
        span = SpanView(span_id=str(raw.get("spanID")), name=str(raw.get("operationName", "")),
                        start_us=int(raw.get("startTime", 0)), duration_us=int(raw.get("duration", 0)),
                        tags=_key_values(raw.get("tags")), events=[_event(log) for log in raw.get("logs") or []],
                        parent_id=parent)
        spans[span.span_id] = span
    root = None
    for span in spans.values():
        parent_span = spans.get(span.parent_id) if span.parent_id else None
        if parent_span is not None:
            parent_span.children.append(span)
        elif span.name == ROOT_NAME:
            root = span
    if root is None:  # not a rebalance, or its root span has not reached Jaeger yet
        return None
    for span in spans.values():
        span.children.sort(key=lambda child: (child.start_us, child.name))
        span.events.sort(key=lambda event: event.at_us)
    return Rebalance(trace_id=trace_id, root=root, linked_trace_ids=list(dict.fromkeys(links)))


def _key_values(items: Any) -> dict[str, Any]:
    return {str(item.get("key")): item.get("value") for item in items or [] if isinstance(item, dict)}


def _event(log: dict[str, Any]) -> SpanEvent:
    fields = _key_values(log.get("fields"))
    name = str(fields.pop("event", ""))
    return SpanEvent(at_us=int(log.get("timestamp", 0)), name=name, fields=fields)


SEARCH_PAGE = 1000  # traces asked of one search; the UI's own ceiling is 1500


class JaegerQuery:
    """Jaeger's HTTP query API (the one its UI uses), at `base_url` (e.g. http://127.0.0.1:16686)."""

    def __init__(self, base_url: str, service: str = "coordinator", timeout_s: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.service = service
        self.timeout_s = timeout_s

    def recent(self, limit: int, group: str | None = None, lookback: str = "1h",
               since_us: int | None = None) -> list[Rebalance]:
        """The latest `limit` rebalances (of one group if given), oldest first; `since_us` (epoch µs): only
        those that started at or after it."""
        # Jaeger's memory store answers a search with the traces it *received* last, not those that *started*
        # last (a rebalance's spans reach it when they end, out of start order). Ask for a wide page and keep the
        # newest by start time ourselves.
        params: dict[str, Any] = {"service": self.service, "operation": ROOT_NAME,
                                  "limit": max(limit, SEARCH_PAGE)}
        if since_us is not None:
            params["start"] = since_us
            params["end"] = _now_us() + 60_000_000
        else:
            params["lookback"] = lookback
        if group is not None:
            params["tags"] = json.dumps({GROUP_KEY: group})
        try:
            body = self._get(f"/api/traces?{urllib.parse.urlencode(params)}")
        except TraceSourceError:
            if params["limit"] == max(1, limit):
                raise
            params["limit"] = max(1, limit)  # a store holding fewer traces than the page refuses the search
            body = self._get(f"/api/traces?{urllib.parse.urlencode(params)}")
        found = rebalances_from_jaeger_json(body)
        return found[-limit:] if limit > 0 else found

    def by_id(self, trace_id: str) -> Rebalance:
        wanted = trace_id.strip().lower()
        if not wanted or any(c not in "0123456789abcdef" for c in wanted) or len(wanted) > 32:
            raise TraceSourceError(f"{trace_id!r} is not a trace id (up to 32 hex digits, as on the log lines' "
                                   f"trace_id=)")
        if len(wanted) < 32:  # a prefix, as the demo's event lines show it: among the recent rebalances
            matches = [r for r in self.recent(1000, lookback="24h") if r.trace_id.startswith(wanted)]
            if len(matches) != 1:
                raise TraceSourceError(f"{len(matches) or 'no'} rebalance traces of the last 24h start with "
                                       f"{wanted}" + (": give more digits" if matches else ""))
            return matches[0]
        try:
            found = rebalances_from_jaeger_json(self._get(f"/api/traces/{wanted}"))
        except TraceSourceError as exc:
            if "404" in str(exc):
                raise TraceSourceError(f"Jaeger at {self.base_url} has no trace {wanted}") from None
            raise
        if not found:
            raise TraceSourceError(f"trace {wanted} is not a rebalance (no root span named '{ROOT_NAME}'), or its "
                                   f"root has not reached Jaeger yet")
        return found[0]

    def raw(self, path: str) -> Any:
        return self._get(path)

    def _get(self, path: str) -> Any:
        url = self.base_url + path
        try:
            with urllib.request.urlopen(url, timeout=self.timeout_s) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            body = exc.read()[:300].decode(errors="replace")
            raise TraceSourceError(f"Jaeger at {self.base_url} answered {exc.code} to {path}: {body}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise TraceSourceError(f"no Jaeger query API at {self.base_url} ({reason}): is Jaeger running? give its "
                                   f"query URL with --jaeger-url (`coordinator jaeger` and the demo print it)") \
                from None
        except ValueError as exc:
            raise TraceSourceError(f"{url} did not answer JSON ({exc}): is it Jaeger's query port?") from None


def demo_jaeger_url(state_dir: Path) -> str | None:
    """The query URL of the Jaeger a running demo started, recorded in its state directory."""
    try:
        url = (state_dir / JAEGER_URL_FILE).read_text().strip()
    except OSError:
        return None
    return url or None


def load_saved(path: Path) -> list[Rebalance]:
    try:
        document = json.loads(path.read_text())
    except OSError as exc:
        raise TraceSourceError(f"cannot read {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise TraceSourceError(f"{path} is not JSON: {exc}") from None
    return rebalances_from_jaeger_json(document)


def _now_us() -> int:
    import time

    return time.time_ns() // 1000


def _state_dir(env: dict[str, str]) -> Path:
    return Path(env.get("COORDINATOR_STATE_DIR") or default_state_dir())


def default_jaeger_url(env: dict[str, str] | None = None) -> str | None:
    """COORDINATOR_JAEGER_URL, else the running demo's Jaeger (its state directory says where)."""
    env = dict(os.environ) if env is None else env
    if env.get("COORDINATOR_JAEGER_URL"):
        return env["COORDINATOR_JAEGER_URL"]
    return demo_jaeger_url(_state_dir(env))


def default_saved_traces(env: dict[str, str] | None = None) -> Path | None:
    """The traces the last demo saved when it stopped, if there are any."""
    path = _state_dir(dict(os.environ) if env is None else env) / SAVED_TRACES_FILE
    return path if path.exists() else None
