"""One OpenTelemetry trace per rebalance, built from the group observer's callbacks (model: docs/tracing.md).

    rebalance                      PreparingRebalance → Stable / Empty (or superseded, or the group unloaded)
    ├── join phase                 PreparingRebalance → CompletingRebalance (or Empty)
    │   └── JoinGroup wait <id>    one per member: its JoinGroup parked → answered (never came: an error span)
    └── sync phase                 CompletingRebalance → Stable
        ├── SyncGroup wait <id>    one per member that waited for the leader's assignment
        └── state-topic write      the leader's assignment appended to the state topic

The root carries events for every state transition and membership change (member failed: the exact failure
line, client id, host, session timeout, time since the last heartbeat) and the first REBALANCE_IN_PROGRESS
answer per member and API. What causes a rebalance (a join, a failure, a leave) happens an instant before the
group enters PreparingRebalance: the shard announces the rebalance with its cause first
(`on_rebalance_starting`), the root starts then, and the cause's events land on it (the event topic's records
of them carry its trace id).

Everything runs synchronously on the event loop inside group logic, so it only creates and ends spans (the
batch processor exports them on its own thread). This observer exists only when tracing is on; the heartbeat
path calls it only for a heartbeat answered REBALANCE_IN_PROGRESS.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from opentelemetry.context import Context
from opentelemetry.trace import (Link, Span, SpanContext, SpanKind, Status, StatusCode, Tracer, get_current_span,
                                 set_span_in_context)

from coordinator.group.observer import GroupObserver, RebalanceCause
from coordinator.security.identity import MemberIdentities
from coordinator.group.state import GroupState

log = logging.getLogger("coordinator.telemetry")

PREPARING, COMPLETING, STABLE, EMPTY, DEAD = (
    GroupState.PREPARING_REBALANCE.value, GroupState.COMPLETING_REBALANCE.value, GroupState.STABLE.value,
    GroupState.EMPTY.value, GroupState.DEAD.value)
FAILURE_LINE = "Member {member_id} in group {group_id} has failed, removing it from the group"

# Attribute names: OTel messaging semantic conventions where one applies, `coordinator.*` for ours.
GROUP = "messaging.consumer.group.name"
SYSTEM = "messaging.system"
CLIENT_ID = "messaging.client.id"
CLIENT_ADDRESS = "client.address"
MEMBER_ID = "coordinator.member.id"
INSTANCE_ID = "coordinator.member.group_instance_id"


@dataclass
class _Rebalance:
    group_id: str
    root: Span
    join_phase: Span
    sync_phase: Span | None = None
    join_waits: dict[str, Span] = field(default_factory=dict)
    sync_waits: dict[str, Span] = field(default_factory=dict)
    last_joined: str | None = None
    busy_answers: set[tuple[str, str]] = field(default_factory=set)
    busy_count: int = 0
    superseded: bool = False
    announced: bool = True  # started by its cause, not yet in PreparingRebalance


class RebalanceTracer(GroupObserver):
    """`member_lookup(group_id, member_id)` returns the member's metadata (client id, host) when known."""

    def __init__(self, tracer: Tracer, now_ns: Callable[[], int] = time.time_ns,
                 member_lookup: Callable[[str, str], Any] | None = None) -> None:
        self._tracer = tracer
        self._now_ns = now_ns
        self._member_lookup = member_lookup or (lambda _group_id, _member_id: None)
        self._active: dict[str, _Rebalance] = {}
        self._last: dict[str, SpanContext] = {}  # each group's latest rebalance: links and the event topic's id
        self._early_joins: dict[str, dict[str, int]] = {}  # JoinGroups parked just before the rebalance began
        self._expiries: dict[tuple[str, str], dict[str, Any]] = {}
        self._writes: dict[tuple[str, int], Span] = {}
        # each member's principal and security protocol, seen on its own requests: its spans carry them, even
        # those begun on another member's request
        self._identities = MemberIdentities()

    # --- for the event topic, request spans and log lines ---------------------------------------------------
    def current_context(self, group_id: str) -> SpanContext | None:
        rebalance = self._active.get(group_id)
        return rebalance.root.get_span_context() if rebalance is not None else self._last.get(group_id)

    def trace_id_for(self, group_id: str) -> str | None:
        """The trace id of the group's rebalance: the one under way (from its cause on), or the last."""
        context = self.current_context(group_id)
        return None if context is None else format(context.trace_id, "032x")

    # --- state ----------------------------------------------------------------------------------------------
    def on_rebalance_starting(self, group_id: str, generation: int, cause: RebalanceCause) -> None:
        """The root starts here, before the events of its cause, so they are on it and carry its trace id."""
        rebalance = self._active.get(group_id)
        if rebalance is None or not rebalance.announced:
            self._begin(group_id, generation, self._now_ns())

    def on_state_change(self, group_id: str, old_state: str, new_state: str, generation: int) -> None:
        now = self._now_ns()
        if new_state == DEAD:  # unloaded or deleted: its members' identities go too
            self._identities.forget_group(group_id)
        if new_state == PREPARING:
            rebalance = self._active.get(group_id)
            if rebalance is None or not rebalance.announced:  # every rebalance is announced; stay safe if not
                rebalance = self._begin(group_id, generation, now)
            rebalance.announced = False
            rebalance.root.set_attribute("coordinator.state.previous", old_state)
            rebalance.root.add_event("state change", {"from": old_state, "to": PREPARING, "generation": generation},
                                     now)
            for member_id, started in self._early_joins.pop(group_id, {}).items():
                self._start_join_wait(rebalance, group_id, member_id, started)
            return
        self._early_joins.pop(group_id, None)
        rebalance = self._active.get(group_id)
        if rebalance is None:
            if new_state == DEAD:
                self._last.pop(group_id, None)
            return
        rebalance.root.add_event("state change", {"from": old_state, "to": new_state, "generation": generation},
                                 now)
        if new_state == COMPLETING:
            self._end_join_phase(rebalance, now)
            rebalance.sync_phase = self._child("sync phase", rebalance.root, group_id, now)
        elif new_state == STABLE:
            self._end_sync_phase(rebalance, now)
        elif new_state == EMPTY:
            self._end_join_phase(rebalance, now)
        elif new_state == DEAD:
            del self._active[group_id]
            self._finish(rebalance, now, Status(StatusCode.ERROR, "group unloaded or deleted during the rebalance"))
            self._last.pop(group_id, None)

    def _begin(self, group_id: str, generation: int, now: int) -> _Rebalance:
        links = []
        previous = self._active.pop(group_id, None)
        if previous is not None:  # CompletingRebalance → PreparingRebalance: that rebalance is over, unfinished
            previous.superseded = True
            previous.root.set_attribute("coordinator.rebalance.outcome", "superseded")
            self._finish(previous, now, Status(StatusCode.ERROR, "superseded by a new rebalance"))
            links.append(Link(previous.root.get_span_context(), {"coordinator.link": "superseded rebalance"}))
        elif group_id in self._last:
            links.append(Link(self._last[group_id], {"coordinator.link": "previous rebalance"}))
        request = get_current_span().get_span_context()
        if request.is_valid:  # started inside a traced request (a LeaveGroup, a commit): it stays its own trace
            links.append(Link(request, {"coordinator.link": "request that started it"}))
        root = self._tracer.start_span("rebalance", context=Context(), kind=SpanKind.INTERNAL, links=links,
                                       start_time=now,
                                       attributes={SYSTEM: "kafka", GROUP: group_id,
                                                   "coordinator.generation.previous": generation})
        rebalance = self._active[group_id] = _Rebalance(group_id, root, self._child("join phase", root, group_id, now))
        return rebalance

    def on_rebalance_started(self, group_id: str, generation: int, cause: RebalanceCause) -> None:
        rebalance = self._active.get(group_id)
        if rebalance is None:
            return
        category = cause.category.value
        attributes: dict[str, Any] = {"coordinator.rebalance.reason": cause.text,
                                      "coordinator.rebalance.reason_category": category}
        if cause.member_id is not None:
            attributes["coordinator.rebalance.member.id"] = cause.member_id
        if cause.client_reason:
            attributes["coordinator.rebalance.client_reason"] = cause.client_reason
        rebalance.root.set_attributes(attributes)
        log.info("event=rebalance_trace_started group=%s generation=%d reason_category=%s trace_id=%s",
                 group_id, generation, category, self.trace_id_for(group_id))

    def on_join_completed(self, group_id: str, generation: int, protocol_name: str | None, leader_id: str | None,
                          member_count: int) -> None:
        rebalance = self._active.get(group_id)
        if rebalance is None:
            return
        attributes: dict[str, Any] = {"coordinator.generation": generation, "coordinator.member_count": member_count}
        if protocol_name:
            attributes["coordinator.protocol.name"] = protocol_name
        if leader_id:
            attributes["coordinator.leader.id"] = leader_id
        rebalance.root.set_attributes(attributes)

    def on_rebalance_completed(self, group_id: str, generation: int, member_count: int, duration_ms: int) -> None:
        rebalance = self._active.pop(group_id, None)
        if rebalance is None:
            return
        now = self._now_ns()
        rebalance.root.set_attributes({"coordinator.generation": generation, "coordinator.member_count": member_count,
                                       "coordinator.rebalance.outcome": "stable" if member_count else "empty",
                                       "coordinator.rebalance.duration_ms": duration_ms})
        self._finish(rebalance, now, Status(StatusCode.OK))
        log.info("event=rebalance_trace_completed group=%s generation=%d members=%d duration_ms=%d trace_id=%s",
                 group_id, generation, member_count, duration_ms, self.trace_id_for(group_id))

    # --- members --------------------------------------------------------------------------------------------
    def on_member_joined(self, group_id: str, member_id: str, group_instance_id: str | None, client_id: str,
                         client_host: str) -> None:
        self._identities.remember(group_id, member_id)
        self._event(group_id, "member joined", {MEMBER_ID: member_id, CLIENT_ID: client_id,
                                                CLIENT_ADDRESS: client_host, **instance_attributes(group_instance_id),
                                                **self._identities.of(group_id, member_id)})

    def on_member_replaced(self, group_id: str, old_member_id: str, new_member_id: str,
                           group_instance_id: str) -> None:
        self._event(group_id, "member replaced", {MEMBER_ID: new_member_id, "coordinator.member.old_id": old_member_id,
                                                  INSTANCE_ID: group_instance_id})
        self._identities.forget(group_id, old_member_id)
        rebalance = self._active.get(group_id)
        if rebalance is not None and old_member_id in rebalance.join_waits:
            rebalance.join_waits[new_member_id] = rebalance.join_waits.pop(old_member_id)

    def on_member_left(self, group_id: str, member_id: str, group_instance_id: str | None, reason: str) -> None:
        self._event(group_id, "member left", {MEMBER_ID: member_id, "coordinator.reason": reason,
                                              **instance_attributes(group_instance_id)})
        self._end_member(group_id, member_id, Status(StatusCode.UNSET), "left the group (LeaveGroup)")
        self._identities.forget(group_id, member_id)

    def on_member_session_expired(self, group_id: str, member_id: str, client_id: str, client_host: str,
                                  session_timeout_ms: int, since_last_heartbeat_ms: int) -> None:
        self._expiries[(group_id, member_id)] = {
            CLIENT_ID: client_id, CLIENT_ADDRESS: client_host, "coordinator.session_timeout_ms": session_timeout_ms,
            "coordinator.since_last_heartbeat_ms": since_last_heartbeat_ms}

    def on_member_failed(self, group_id: str, member_id: str, group_instance_id: str | None, reason: str) -> None:
        attributes = {"message": FAILURE_LINE.format(member_id=member_id, group_id=group_id), MEMBER_ID: member_id,
                      "coordinator.reason": reason, **instance_attributes(group_instance_id)}
        detail = self._expiries.pop((group_id, member_id), None)
        if detail is None:
            detail = self._member_attributes(group_id, member_id)
        attributes.update(detail)
        self._event(group_id, "member failed", attributes)
        rebalance = self._active.get(group_id)
        if (rebalance is not None and not rebalance.announced and member_id not in rebalance.join_waits
                and rebalance.sync_phase is None):
            # a member the join phase waited for in vain: its wait spans the whole phase, in error
            span = self._member_span("JoinGroup wait", rebalance.join_phase, group_id, member_id,
                                     _start_ns(rebalance.join_phase))
            rebalance.join_waits[member_id] = span
            span.set_attribute("coordinator.member.never_joined", True)
        self._end_member(group_id, member_id, Status(StatusCode.ERROR, reason), None)
        self._identities.forget(group_id, member_id)

    def on_join_waiting(self, group_id: str, member_id: str) -> None:
        self._identities.remember(group_id, member_id)
        now = self._now_ns()
        rebalance = self._active.get(group_id)
        if rebalance is None or rebalance.sync_phase is not None:
            self._early_joins.setdefault(group_id, {}).setdefault(member_id, now)
            return
        if member_id in rebalance.join_waits:
            rebalance.join_waits[member_id].add_event("JoinGroup sent again", timestamp=now)
        else:
            self._start_join_wait(rebalance, group_id, member_id, now)

    def on_sync_waiting(self, group_id: str, member_id: str) -> None:
        self._identities.remember(group_id, member_id)
        rebalance = self._active.get(group_id)
        if rebalance is None or rebalance.sync_phase is None:
            return
        now = self._now_ns()
        if member_id in rebalance.sync_waits:
            rebalance.sync_waits[member_id].add_event("SyncGroup sent again", timestamp=now)
        else:
            rebalance.sync_waits[member_id] = self._member_span("SyncGroup wait", rebalance.sync_phase, group_id,
                                                                member_id, now)

    def on_rebalance_in_progress(self, group_id: str, member_id: str, api: str) -> None:
        rebalance = self._active.get(group_id)
        if rebalance is None:
            return
        rebalance.busy_count += 1
        if (member_id, api) not in rebalance.busy_answers:  # the first per member and API; the rest are counted
            rebalance.busy_answers.add((member_id, api))
            rebalance.root.add_event("REBALANCE_IN_PROGRESS", {"coordinator.api": api, MEMBER_ID: member_id},
                                     self._now_ns())

    # --- the state-topic write of the leader's assignment ---------------------------------------------------
    def on_assignment_write_started(self, group_id: str, generation: int) -> None:
        rebalance = self._active.get(group_id)
        if rebalance is None or rebalance.sync_phase is None:
            return
        span = self._child("state-topic write", rebalance.sync_phase, group_id, self._now_ns())
        span.set_attribute("coordinator.generation", generation)
        self._writes[(group_id, generation)] = span

    def on_assignment_write_completed(self, group_id: str, generation: int, error: str) -> None:
        span = self._writes.pop((group_id, generation), None)
        if span is None:
            return
        span.set_attribute("coordinator.error", error)
        span.set_status(Status(StatusCode.OK) if error == "NONE" else Status(StatusCode.ERROR, error))
        span.end(self._now_ns())

    # --- helpers --------------------------------------------------------------------------------------------
    def _child(self, name: str, parent: Span, group_id: str, now: int) -> Span:
        return self._tracer.start_span(name, context=set_span_in_context(parent), start_time=now,
                                       attributes={SYSTEM: "kafka", GROUP: group_id})

    def _member_span(self, name: str, parent: Span, group_id: str, member_id: str, start: int) -> Span:
        span = self._child(f"{name} {member_id}", parent, group_id, start)
        span.set_attributes({MEMBER_ID: member_id, **self._member_attributes(group_id, member_id)})
        return span

    def _member_attributes(self, group_id: str, member_id: str) -> dict[str, Any]:
        member = self._member_lookup(group_id, member_id)
        if member is None:
            return dict(self._identities.of(group_id, member_id))
        attributes = {CLIENT_ID: member.client_id, CLIENT_ADDRESS: member.client_host,
                      "coordinator.session_timeout_ms": member.session_timeout_ms}
        attributes.update(instance_attributes(member.group_instance_id))
        attributes.update(self._identities.of(group_id, member_id))
        return attributes

    def _start_join_wait(self, rebalance: _Rebalance, group_id: str, member_id: str, started: int) -> None:
        rebalance.join_waits[member_id] = self._member_span("JoinGroup wait", rebalance.join_phase, group_id,
                                                            member_id, started)
        rebalance.last_joined = member_id

    def _event(self, group_id: str, name: str, attributes: dict[str, Any]) -> None:
        rebalance = self._active.get(group_id)
        if rebalance is not None:  # a change outside any rebalance is no trace's
            rebalance.root.add_event(name, attributes, self._now_ns())

    def _end_member(self, group_id: str, member_id: str, status: Status, outcome: str | None) -> None:
        rebalance = self._active.get(group_id)
        if rebalance is None:
            return
        now = self._now_ns()
        for waits in (rebalance.join_waits, rebalance.sync_waits):
            span = waits.get(member_id)
            if span is not None and span.is_recording():
                if outcome:
                    span.set_attribute("coordinator.outcome", outcome)
                span.set_status(status)
                span.end(now)

    def _end_join_phase(self, rebalance: _Rebalance, now: int) -> None:
        if rebalance.last_joined is not None:
            rebalance.join_phase.set_attribute("coordinator.join.last_member", rebalance.last_joined)
            last = rebalance.join_waits.get(rebalance.last_joined)
            if last is not None and last.is_recording():
                last.set_attribute("coordinator.member.last_to_join", True)
        rebalance.join_phase.set_attribute("coordinator.join.members", len(rebalance.join_waits))
        _end_all(rebalance.join_waits.values(), now)
        _end(rebalance.join_phase, now)

    def _end_sync_phase(self, rebalance: _Rebalance, now: int) -> None:
        _end_all(rebalance.sync_waits.values(), now)
        if rebalance.sync_phase is not None:
            _end(rebalance.sync_phase, now)

    def _finish(self, rebalance: _Rebalance, now: int, status: Status) -> None:
        for span in (*rebalance.join_waits.values(), rebalance.join_phase, *rebalance.sync_waits.values()):
            if span.is_recording():
                span.set_status(status if status.status_code is StatusCode.ERROR else Status(StatusCode.UNSET))
                span.end(now)
        if rebalance.sync_phase is not None:
            _end(rebalance.sync_phase, now)
        if rebalance.busy_count:
            rebalance.root.set_attribute("coordinator.rebalance_in_progress_answers", rebalance.busy_count)
        rebalance.root.set_status(status)
        rebalance.root.end(now)
        self._last[rebalance.group_id] = rebalance.root.get_span_context()


def instance_attributes(group_instance_id: str | None) -> dict[str, Any]:
    return {} if group_instance_id is None else {INSTANCE_ID: group_instance_id}


def _end(span: Span, now: int) -> None:
    if span.is_recording():
        span.end(now)


def _end_all(spans: Any, now: int) -> None:
    for span in spans:
        _end(span, now)


def _start_ns(span: Span) -> int:
    return getattr(span, "start_time", None) or 0

