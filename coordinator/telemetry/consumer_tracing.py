"""One OpenTelemetry trace per consumer group epoch bump (KIP-848), built from the consumer-group callbacks of
the group observer (coordinator/group/modern/observing.py calls them; model: docs/tracing.md).

    rebalance                      group epoch bumped → every member at the target epoch (or superseded by the
    │                              next bump, linked; or the group unloaded)
    ├── target assignment          the bump → the target computed for its epoch (on the next heartbeat)
    └── reconcile <member>         one per member that had to move: the target → its epoch reached (events:
                                   revocation requested, partitions revoked, waiting for partitions, assignment
                                   delivered, epoch reached); a member fenced meanwhile ends it in error

The root is named "rebalance" as a classic group's is (`coordinator trace --group` finds either) and carries
`coordinator.group.protocol=consumer`. Bounded whatever the group's size: at most MAX_MEMBER_SPANS member spans
and MAX_ROOT_EVENTS membership events per trace; members past those are counted on the root (as classic traces
count REBALANCE_IN_PROGRESS answers past the first per member). Members whose partitions do not move (they only
take the new epoch) get spans only while the group is small; otherwise they are counted.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, SpanContext, SpanKind, Status, StatusCode, Tracer, set_span_in_context

from coordinator.group.observer import (EPOCH_REACHED, ConsumerRebalance, GroupObserver, RebalanceCategory,
                                        Reconciliation)
from coordinator.security.identity import MemberIdentities
from coordinator.telemetry.tracing import (CLIENT_ADDRESS, CLIENT_ID, GROUP, INSTANCE_ID, MEMBER_ID, SYSTEM,
                                          instance_attributes)

log = logging.getLogger("coordinator.telemetry")

MAX_MEMBER_SPANS = 64  # reconcile spans per trace; the rest are counted
MAX_ROOT_EVENTS = 64  # membership events per trace; the rest are counted
PROTOCOL = "coordinator.group.protocol"


@dataclass
class _Rebalance:
    group_id: str
    group_epoch: int
    root: Span
    target: Span | None
    members: dict[str, Span] = field(default_factory=dict)
    target_at: int = 0  # when the target was computed (ns): a member's reconciliation starts there
    member_count: int = 0
    events: int = 0
    events_unrecorded: int = 0
    reconciled: int = 0
    unsampled: int = 0  # members that moved without a span of their own
    last_reconciled: str | None = None


class ConsumerRebalanceTracer(GroupObserver):
    def __init__(self, tracer: Tracer, now_ns: Callable[[], int] = time.time_ns) -> None:
        self._tracer = tracer
        self._now_ns = now_ns
        self._active: dict[str, _Rebalance] = {}
        self._last: dict[str, SpanContext] = {}
        # each member's principal and security protocol, from the heartbeat it joined with: its reconcile span
        # carries them even when written on another member's request (a conversion)
        self._identities = MemberIdentities()

    # --- for the event topic and log lines ------------------------------------------------------------------
    def trace_id_for(self, group_id: str) -> str | None:
        rebalance = self._active.get(group_id)
        context = rebalance.root.get_span_context() if rebalance is not None else self._last.get(group_id)
        return None if context is None else format(context.trace_id, "032x")

    # --- the rebalance ----------------------------------------------------------------------------------------
    def on_consumer_rebalance_started(self, group_id: str, rebalance: ConsumerRebalance) -> None:
        now = self._now_ns()
        links = []
        previous = self._active.pop(group_id, None)
        if previous is not None:
            self._finish(previous, now, "superseded", Status(StatusCode.UNSET))
            links.append(Link(previous.root.get_span_context(), {"coordinator.link": "superseded rebalance"}))
        elif group_id in self._last:
            links.append(Link(self._last[group_id], {"coordinator.link": "previous rebalance"}))
        cause = rebalance.cause
        attributes: dict[str, Any] = {
            SYSTEM: "kafka", GROUP: group_id, PROTOCOL: "consumer",
            "coordinator.group_epoch": rebalance.group_epoch,
            "coordinator.group_epoch.previous": rebalance.previous_epoch,
            "coordinator.member_count": rebalance.member_count,
            "coordinator.rebalance.reason": cause.text,
            "coordinator.rebalance.reason_category": cause.category.value}
        if cause.member_id is not None:
            attributes["coordinator.rebalance.member.id"] = cause.member_id
        root = self._tracer.start_span("rebalance", context=Context(), kind=SpanKind.INTERNAL, links=links,
                                       start_time=now, attributes=attributes)
        target = self._child("target assignment", root, group_id, now)
        target.set_attribute("coordinator.assignment_epoch", rebalance.group_epoch)
        self._active[group_id] = _Rebalance(group_id, rebalance.group_epoch, root, target,
                                            member_count=rebalance.member_count)
        log.info("event=rebalance_trace_started group=%s protocol=consumer group_epoch=%d reason_category=%s "
                 "trace_id=%s", group_id, rebalance.group_epoch, cause.category.value, self.trace_id_for(group_id))

    def on_consumer_rebalance_resumed(self, group_id: str, group_epoch: int, member_count: int) -> None:
        """Loaded mid-rebalance: a trace of its end, linked to nothing (the start was another instance's)."""
        now = self._now_ns()
        previous = self._active.pop(group_id, None)
        if previous is not None:
            self._finish(previous, now, "abandoned", Status(StatusCode.ERROR, "the group was loaded again"))
        root = self._tracer.start_span("rebalance", context=Context(), kind=SpanKind.INTERNAL, start_time=now,
                                       attributes={
                                           SYSTEM: "kafka", GROUP: group_id, PROTOCOL: "consumer",
                                           "coordinator.group_epoch": group_epoch,
                                           "coordinator.member_count": member_count,
                                           "coordinator.rebalance.resumed": True,
                                           "coordinator.rebalance.reason": f"Loaded by this instance in the middle "
                                           f"of the rebalance to group epoch {group_epoch}; the instance that had "
                                           "the group traced its start.",
                                           "coordinator.rebalance.reason_category": "resumed"})
        self._active[group_id] = _Rebalance(group_id, group_epoch, root, None, target_at=now,
                                            member_count=member_count)
        log.info("event=rebalance_trace_started group=%s protocol=consumer group_epoch=%d reason_category=resumed "
                 "trace_id=%s", group_id, group_epoch, self.trace_id_for(group_id))

    def on_consumer_target_assigned(self, group_id: str, assignment_epoch: int, member_count: int,
                                    changed_members: int, assignor: str) -> None:
        rebalance = self._active.get(group_id)
        if rebalance is None or rebalance.group_epoch != assignment_epoch:
            return
        now = self._now_ns()
        rebalance.target_at, rebalance.member_count = now, member_count
        attributes: dict[str, Any] = {"coordinator.assignment_epoch": assignment_epoch,
                                      "coordinator.assignor": assignor,
                                      "coordinator.member_count": member_count,
                                      "coordinator.target.changed_members": changed_members}
        rebalance.root.set_attributes(attributes)
        if rebalance.target is not None:
            rebalance.target.set_attributes(attributes)
            rebalance.target.end(now)
            rebalance.target = None

    def on_consumer_member_reconciled(self, group_id: str, reconciliation: Reconciliation) -> None:
        rebalance = self._active.get(group_id)
        if rebalance is None or rebalance.target is not None or reconciliation.target_epoch != rebalance.group_epoch:
            return  # a move towards an older target, or before this one is known
        now = self._now_ns()
        member_id = reconciliation.member_id
        span = rebalance.members.get(member_id)
        if span is None and self._deserves_span(rebalance, reconciliation):
            span = rebalance.members[member_id] = self._child(f"reconcile {member_id}", rebalance.root, group_id,
                                                              rebalance.target_at)
            span.set_attributes({MEMBER_ID: member_id, **self._identities.of(group_id, member_id),
                                 "coordinator.member_epoch.previous": reconciliation.previous_epoch})
        elif span is None and reconciliation.steps != (EPOCH_REACHED,):
            rebalance.unsampled += 1
        if span is not None:
            for step in reconciliation.steps:
                span.add_event(step, {"coordinator.member_epoch": reconciliation.member_epoch,
                                      "coordinator.partitions.assigned": reconciliation.assigned,
                                      "coordinator.partitions.revoking": reconciliation.revoking,
                                      "coordinator.partitions.added": reconciliation.added}, now)
        if EPOCH_REACHED in reconciliation.steps:
            rebalance.reconciled += 1
            rebalance.last_reconciled = member_id
            if span is not None and span.is_recording():
                span.set_attributes({"coordinator.member_epoch": reconciliation.member_epoch,
                                     "coordinator.partitions.assigned": reconciliation.assigned})
                span.end(now)

    def _deserves_span(self, rebalance: _Rebalance, reconciliation: Reconciliation) -> bool:
        if len(rebalance.members) >= MAX_MEMBER_SPANS:
            return False
        return reconciliation.steps != (EPOCH_REACHED,) or rebalance.member_count <= MAX_MEMBER_SPANS

    def on_consumer_rebalance_completed(self, group_id: str, group_epoch: int, member_count: int,
                                        duration_ms: int | None) -> None:
        rebalance = self._active.pop(group_id, None)
        if rebalance is None:
            return
        rebalance.root.set_attribute("coordinator.member_count", member_count)
        if duration_ms is not None:
            rebalance.root.set_attribute("coordinator.rebalance.duration_ms", duration_ms)
        self._finish(rebalance, self._now_ns(), "stable" if member_count else "empty", Status(StatusCode.OK))
        log.info("event=rebalance_trace_completed group=%s protocol=consumer group_epoch=%d members=%d "
                 "duration_ms=%s trace_id=%s", group_id, group_epoch, member_count, duration_ms,
                 self.trace_id_for(group_id))

    def on_consumer_rebalance_abandoned(self, group_id: str, group_epoch: int, reason: str) -> None:
        rebalance = self._active.pop(group_id, None)
        if rebalance is not None:
            self._finish(rebalance, self._now_ns(), "abandoned", Status(StatusCode.ERROR, reason))
        self._last.pop(group_id, None)  # the group is gone from here: no later event is this trace's
        self._identities.forget_group(group_id)

    def on_consumer_rebalance_converted(self, group_id: str, group_epoch: int) -> None:
        """The classic group's rebalance, caused by the conversion, carries this one on: no error."""
        rebalance = self._active.pop(group_id, None)
        if rebalance is not None:
            rebalance.root.set_attribute("coordinator.rebalance.converted_to", "classic")
            self._finish(rebalance, self._now_ns(), "converted", Status(StatusCode.UNSET))
        self._last.pop(group_id, None)  # the classic group's traces are the classic tracer's
        self._identities.forget_group(group_id)

    # --- members ----------------------------------------------------------------------------------------------
    def on_consumer_member_joined(self, group_id: str, member_id: str, group_instance_id: str | None,
                                  client_id: str, client_host: str, protocol: str) -> None:
        identity = self._identities.remember(group_id, member_id)  # on the joining member's own request
        self._event(group_id, "member joined", {MEMBER_ID: member_id, CLIENT_ID: client_id,
                                                CLIENT_ADDRESS: client_host, "coordinator.member.protocol": protocol,
                                                **instance_attributes(group_instance_id), **identity})

    def on_consumer_member_replaced(self, group_id: str, old_member_id: str, new_member_id: str,
                                    group_instance_id: str) -> None:
        self._event(group_id, "member replaced", {MEMBER_ID: new_member_id, "coordinator.member.old_id": old_member_id,
                                                  INSTANCE_ID: group_instance_id})
        self._end_member(group_id, old_member_id, "replaced by a static member", Status(StatusCode.UNSET))
        self._identities.forget(group_id, old_member_id)

    def on_consumer_member_left(self, group_id: str, member_id: str, group_instance_id: str | None,
                                reason: str) -> None:
        self._event(group_id, "member left", {MEMBER_ID: member_id, "coordinator.reason": reason,
                                              **instance_attributes(group_instance_id)})
        self._end_member(group_id, member_id, "left the group", Status(StatusCode.UNSET))
        self._identities.forget(group_id, member_id)

    def on_consumer_member_failed(self, group_id: str, member_id: str, group_instance_id: str | None,
                                  reason: str, category: RebalanceCategory) -> None:
        self._event(group_id, "member failed", {"message": reason, MEMBER_ID: member_id,
                                                "coordinator.reason": category.value,
                                                **instance_attributes(group_instance_id)})
        self._end_member(group_id, member_id, "fenced", Status(StatusCode.ERROR, reason))
        self._identities.forget(group_id, member_id)

    # --- helpers ----------------------------------------------------------------------------------------------
    def _event(self, group_id: str, name: str, attributes: dict[str, Any]) -> None:
        rebalance = self._active.get(group_id)
        if rebalance is None:
            return  # a change outside any rebalance is no trace's
        if rebalance.events >= MAX_ROOT_EVENTS:
            rebalance.events_unrecorded += 1
            return
        rebalance.events += 1
        rebalance.root.add_event(name, attributes, self._now_ns())

    def _end_member(self, group_id: str, member_id: str, outcome: str, status: Status) -> None:
        rebalance = self._active.get(group_id)
        span = rebalance.members.get(member_id) if rebalance is not None else None
        if span is not None and span.is_recording():
            span.set_attribute("coordinator.outcome", outcome)
            span.set_status(status)
            span.end(self._now_ns())

    def _child(self, name: str, parent: Span, group_id: str, start: int) -> Span:
        return self._tracer.start_span(name, context=set_span_in_context(parent), start_time=start,
                                       attributes={SYSTEM: "kafka", GROUP: group_id})

    def _finish(self, rebalance: _Rebalance, now: int, outcome: str, status: Status) -> None:
        if rebalance.target is not None and rebalance.target.is_recording():
            rebalance.target.set_attribute("coordinator.outcome", "not computed")
            rebalance.target.end(now)
        for span in rebalance.members.values():
            if span.is_recording():
                span.set_attribute("coordinator.outcome", outcome)
                span.set_status(status if status.status_code is StatusCode.ERROR else Status(StatusCode.UNSET))
                span.end(now)
        counts: dict[str, Any] = {"coordinator.rebalance.outcome": outcome,
                                  "coordinator.members.reconciled": rebalance.reconciled,
                                  "coordinator.members.unsampled": rebalance.unsampled}
        if rebalance.events_unrecorded:
            counts["coordinator.member_events.unrecorded"] = rebalance.events_unrecorded
        if rebalance.last_reconciled is not None:
            counts["coordinator.reconcile.last_member"] = rebalance.last_reconciled
        rebalance.root.set_attributes(counts)
        rebalance.root.set_status(status)
        rebalance.root.end(now)
        self._last[rebalance.group_id] = rebalance.root.get_span_context()

