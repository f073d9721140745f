"""Draws a rebalance trace (coordinator/telemetry/trace_view.py) in the terminal: a header (group, generations,
duration, outcome, why), the span waterfall with each phase's and each member's JoinGroup/SyncGroup wait, bars
scaled to the width, and the root's events (`member failed` with Kafka's line and its fields) on their own
timeline. Every line fits `width` columns; colour is optional (ANSI), added after the layout."""

from __future__ import annotations

import re
import textwrap
import time
from collections.abc import Iterable
from dataclasses import dataclass

from coordinator.telemetry.trace_view import (CLIENT_KEY, PROTOCOL_KEY, RECONCILE_PREFIX, WAIT_PREFIXES, Rebalance,
                                              SpanEvent, SpanView)

MIN_BAR = 10
_UUID_TAIL = re.compile(r"^(?P<prefix>.+)-(?P<uuid>[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})$")
_EIGHTHS = " ▏▎▍▌▋▊▉"
_STYLES = {"bold": "1", "dim": "2", "red": "31", "green": "32", "yellow": "33", "blue": "34", "magenta": "35",
           "cyan": "36"}
# event fields shown on the event's first line rather than as key=value
_EVENT_TEXT_KEYS = ("message",)
_FIELD_LABELS = {"coordinator.member.id": "member", "coordinator.reason": "reason", CLIENT_KEY: "client",
                 "client.address": "host", "coordinator.session_timeout_ms": "session_timeout_ms",
                 "coordinator.since_last_heartbeat_ms": "since_last_heartbeat_ms",
                 "coordinator.member.group_instance_id": "instance", "coordinator.member.old_id": "old member",
                 "coordinator.api": "api"}


@dataclass(frozen=True)
class Segment:
    text: str
    style: str = ""


Line = list[Segment]


def to_text(lines: Iterable[Line], color: bool = False) -> str:
    return "\n".join("".join(_paint(s, color) for s in line).rstrip() for line in lines)


def _paint(segment: Segment, color: bool) -> str:
    if not color or not segment.style or not segment.text:
        return segment.text
    codes = ";".join(_STYLES[name] for name in segment.style.split())
    return f"\x1b[{codes}m{segment.text}\x1b[0m"


# --- numbers and names ---------------------------------------------------------------------------------------
def duration(us: int) -> str:
    if us == 0:
        return "0 ms"
    if us < 1000:
        return f"{us / 1000:.1f} ms"
    if us < 10_000_000:
        return f"{us / 1000:.0f} ms"
    return f"{us / 1_000_000:.1f} s"


def offset(us: int) -> str:
    return ("-" if us < 0 else "+") + duration(abs(us))


def short_member(member_id: str) -> str:
    """Kafka's member ids are `<client.id>-<uuid>`: the client id and the uuid's first 4 digits tell members
    apart on one line; the events show the whole id."""
    match = _UUID_TAIL.match(member_id)
    return f"{match['prefix']}-{match['uuid'][:4]}…" if match else member_id


def clip(text: str, width: int) -> str:
    if len(text) <= width:
        return text
    if width <= 1:
        return text[:width]
    return text[:width - 1] + "…"


def clock(us: int) -> str:
    seconds = us / 1_000_000
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(seconds)) + f".{int(us % 1_000_000) // 1000:03d} UTC"


# --- one rebalance ---------------------------------------------------------------------------------------------
def render_rebalance(rebalance: Rebalance, width: int = 80) -> list[Line]:
    width = max(40, width)
    lines: list[Line] = []
    lines.extend(_header(rebalance, width))
    lines.append([])
    lines.extend(_waterfall(rebalance, width))
    events = _events(rebalance, width)
    if events:
        lines.append([])
        lines.extend(events)
    return lines


def _header(r: Rebalance, width: int) -> list[Line]:
    outcome = str(r.tag("coordinator.rebalance.outcome") or ("error" if r.root.failed else "stable"))
    style = "red" if r.root.failed else "green" if outcome == "stable" else "yellow"
    generations = _epochs(r)
    title = f"rebalance of {r.group} "
    rest = f" {generations} · {duration(r.duration_us)} · "
    head = [Segment("━━ ", "dim"), Segment(title, "bold"), Segment(rest), Segment(outcome, style + " bold")]
    used = sum(len(s.text) for s in head)
    if used < width:
        head.append(Segment(" " + "━" * (width - used - 1), "dim"))
    lines: list[Line] = [head if used <= width else [Segment(clip("".join(s.text for s in head), width), "bold")]]
    facts = [f"trace {r.trace_id}", clock(r.start_us)]
    members = r.tag("coordinator.member_count")
    if members is not None:
        facts.append(f"{members} member{'s' if members != 1 else ''}")
    leader = r.tag("coordinator.leader.id")
    if leader:
        facts.append(f"leader {short_member(str(leader))}")
    protocol = r.tag("coordinator.protocol.name")
    if protocol:
        facts.append(str(protocol))
    row = ""
    for fact in facts:  # whole facts per line: a wrap never starts a line with the separator
        if row and len(row) + 3 + len(fact) > width:
            lines.append([Segment(clip(row, width), "dim")])
            row = ""
        row = f"{row} · {fact}" if row else fact
    lines.append([Segment(clip(row, width), "dim")])
    reason = r.tag("coordinator.rebalance.reason")
    category = r.tag("coordinator.rebalance.reason_category")
    if reason or category:
        text = f"{reason or ''}" + (f" [{category}]" if category else "")
        lines.extend(_wrapped(text, width, "why: ", "     "))
    if r.root.failed and r.root.status_text:
        lines.extend(_wrapped(r.root.status_text, width, "ended: ", "       ", "red"))
    busy = r.tag("coordinator.rebalance_in_progress_answers")
    if busy:
        lines.append([Segment(f"REBALANCE_IN_PROGRESS answers: {busy}", "dim")])
    if r.linked_trace_ids:
        lines.extend(_wrapped(", ".join(r.linked_trace_ids), width, "linked: ", "        ", "dim"))
    return lines


def _epochs(r: Rebalance) -> str:
    """A classic group's generations, or a consumer group's group epochs (KIP-848)."""
    if r.tag(PROTOCOL_KEY) == "consumer":
        return f"group epoch {r.tag('coordinator.group_epoch.previous')} → {r.tag('coordinator.group_epoch')}"
    previous, generation = r.tag("coordinator.generation.previous"), r.tag("coordinator.generation")
    return f"generation {previous} → {generation if generation is not None else '?'}"


@dataclass(frozen=True)
class _Row:
    tree: str  # the tree's drawing before the name
    name: str
    member: str  # a member wait's member, shortened to fit
    notes: str
    span: SpanView
    style: str

    def label(self, width: int) -> str:
        """Shortens the member's name (keeping its distinguishing tail), then the rest, to fit `width`."""
        fixed = f"{self.tree}{self.name}{' ' if self.member else ''}{self.notes}"
        member = self.member
        room = width - len(fixed)
        if member and len(member) > room:  # keep the head and the distinguishing tail (`…-5976…`)
            tail = min(len(member), 6)
            head = max(1, room - tail - 1)
            member = member[:head] + "…" + member[-tail:]
        label = f"{self.tree}{self.name}{' ' + member if member else ''}{self.notes}"
        return clip(label, width)


def _rows(root: SpanView) -> list[_Row]:
    rows: list[_Row] = []

    def walk(span: SpanView, prefix: str, child_prefix: str) -> None:
        name, member, notes = _span_label(span)
        rows.append(_Row(prefix, name, member, notes, span, _bar_style(span)))
        for i, child in enumerate(span.children):
            last = i == len(span.children) - 1
            walk(child, child_prefix + ("└ " if last else "├ "), child_prefix + ("  " if last else "│ "))

    walk(root, "", "")
    return rows


def _span_label(span: SpanView) -> tuple[str, str, str]:
    """(what, whose, notes): a member wait is `JoinGroup <member> (last)`; any span in error gets a ✗."""
    for prefix in WAIT_PREFIXES:
        if span.name.startswith(prefix):
            member = span.member_id or span.name[len(prefix):]
            notes = []
            if span.tags.get("coordinator.member.last_to_join"):
                notes.append("last")
            if span.tags.get("coordinator.member.never_joined"):
                notes.append("never joined")
            if span.failed:
                notes.append("✗")
            return prefix.split()[0], short_member(member), f" ({', '.join(notes)})" if notes else ""
    if span.name.startswith(RECONCILE_PREFIX):  # a consumer group member's move: what it took
        member = span.member_id or span.name[len(RECONCILE_PREFIX):]
        steps = {event.name for event in span.events}
        notes = [note for step, note in _RECONCILE_NOTES if step in steps]
        if span.failed:
            notes.append("✗")
        return RECONCILE_PREFIX.strip(), short_member(member), f" ({', '.join(notes)})" if notes else ""
    return span.name, "", " ✗" if span.failed else ""


_RECONCILE_NOTES = (("revocation requested", "revoked first"), ("waiting for partitions", "waited"),
                    ("epoch reached", "reached"))


def _bar_style(span: SpanView) -> str:
    if span.failed:
        return "red"
    if span.name.startswith("JoinGroup") or span.name == "join phase":
        return "cyan"
    if span.name.startswith("SyncGroup") or span.name == "sync phase":
        return "magenta"
    if span.name == "state-topic write":
        return "yellow"
    return "green"


def _waterfall(r: Rebalance, width: int) -> list[Line]:
    rows = _rows(r.root)
    origin = r.root.start_us
    total = max(1, max(span.end_us for span in r.spans()) - origin)
    numbers = 19  # " " + "+1234 ms" + " " + "1234 ms" + "  "
    longest = max(len(row.label(1000)) for row in rows)
    label_width = min(longest, max(16, int(width * 0.42)), width - numbers - MIN_BAR)
    bar_width = max(MIN_BAR, width - label_width - numbers)
    end = duration(total)
    scale = "0" + " " + "─" * max(1, bar_width - len(end) - 3) + " " + end
    lines: list[Line] = [[Segment(" " * label_width + f" {'start':>8} {'took':>7}  ", "dim"),
                          Segment(clip(scale, bar_width), "dim")]]
    for row in rows:
        start = row.span.start_us - origin
        lines.append([Segment(row.label(label_width).ljust(label_width), "red" if row.span.failed else ""),
                      Segment(f" {offset(start):>8} {duration(row.span.duration_us):>7}  ", "dim"),
                      Segment(_bar(start, row.span.duration_us, total, bar_width), row.style)])
    return lines


def _bar(start_us: int, duration_us: int, total_us: int, width: int) -> str:
    """Eighth-of-a-cell resolution at the end; a span too short to show still gets a sliver."""
    start_cell = min(width - 1, max(0, int(start_us * width / total_us)))
    eighths = max(1, round(duration_us * width * 8 / total_us))
    eighths = min(eighths, (width - start_cell) * 8)
    full, part = divmod(eighths, 8)
    return " " * start_cell + "█" * full + (_EIGHTHS[part] if part else "")


# --- events ------------------------------------------------------------------------------------------------------
def _events(r: Rebalance, width: int) -> list[Line]:
    if not r.root.events:
        return []
    lines: list[Line] = [[Segment("events", "bold")]]
    indent = 10
    for event in r.root.events:
        when = f"{offset(event.at_us - r.start_us):>9} "
        failed = event.name == "member failed"
        text, details = _event_text(event), _event_fields(event)
        if "message" in event.fields:  # Kafka's line as a paragraph of its own, then its fields
            paragraphs = [(f"{event.name}: {text}", "red bold" if failed else ""), (details, "dim")]
        else:
            paragraphs = [(" ".join(p for p in (f"{event.name}:" if text or details else event.name, text,
                                                details) if p), "")]
        first = True
        for paragraph, style in paragraphs:
            for piece in textwrap.wrap(paragraph, max(10, width - indent), break_on_hyphens=False):
                lines.append([Segment(when if first else " " * indent, "dim"), Segment(piece, style)])
                first = False
    return lines


def _event_text(event: SpanEvent) -> str:
    fields = event.fields
    if "message" in fields:
        return str(fields["message"])
    if event.name == "state change":
        return f"{fields.get('from')} → {fields.get('to')} (generation {fields.get('generation')})"
    member = fields.get("coordinator.member.id")
    return short_member(str(member)) if member else ""


_FIELD_ORDER = ("coordinator.api", "coordinator.reason", "coordinator.since_last_heartbeat_ms",
                "coordinator.session_timeout_ms", CLIENT_KEY, "client.address")


def _event_fields(event: SpanEvent) -> str:
    if event.name == "state change":
        return ""
    shown = {key: value for key, value in event.fields.items()
             if key not in _EVENT_TEXT_KEYS and key != "coordinator.member.id"}  # the text names the member
    ordered = sorted(shown, key=lambda k: _FIELD_ORDER.index(k) if k in _FIELD_ORDER else len(_FIELD_ORDER))
    return "  ".join(f"{_FIELD_LABELS.get(key, key)}={shown[key]}" for key in ordered)


def _wrapped(text: str, width: int, first: str, rest: str, style: str = "") -> list[Line]:
    wrapped = textwrap.wrap(text, width, initial_indent=first, subsequent_indent=rest, break_on_hyphens=False)
    return [[Segment(line, style)] for line in wrapped]


# --- many rebalances, one line each --------------------------------------------------------------------------
def render_list(rebalances: list[Rebalance], width: int = 80) -> list[Line]:
    """One line per rebalance: when, group, generation, duration, why, who failed, trace id (the handle to
    `coordinator trace <id>`)."""
    lines: list[Line] = []
    for r in rebalances:
        when = time.strftime("%H:%M:%S", time.gmtime(r.start_us / 1_000_000))
        consumer = r.tag(PROTOCOL_KEY) == "consumer"
        generation = r.tag("coordinator.group_epoch" if consumer else "coordinator.generation")
        failed = [short_member(str(e.fields.get("coordinator.member.id", "?"))) for e in r.failures()]
        why = str(r.tag("coordinator.rebalance.reason_category") or "?")
        if failed:
            why += " " + ",".join(failed)
        head = f"{when} {r.trace_id} "
        tail = f"{r.group} g{generation} {duration(r.duration_us)} {why}"
        style = "red" if r.root.failed or failed else ""
        if len(head) + 10 > width:  # too narrow for the whole id: its first 8 digits still find it in Jaeger
            head = f"{when} {r.trace_id[:8]}… "
        lines.append([Segment(clip(head, width), "dim"), Segment(clip(tail, max(0, width - len(head))), style)])
    return lines
