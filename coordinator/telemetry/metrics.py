"""Coordinator metrics through the OpenTelemetry metrics API (exported by OTLP and/or the Prometheus endpoint).

Events (rebalances, failures, expirations) are counted by `MetricsObserver`, a group observer. What is a level
(groups by state, members, purgatory sizes, connections) or already counted by the code that owns it (heartbeats:
one integer increment on the hot path) is read by observable instruments at collection time only, so a
heartbeat costs nothing more with metrics on. Prometheus names: dots become underscores, counters end in
`_total`, e.g. `coordinator_rebalances_total{reason="session_timeout"}`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections import Counter as Tally
from collections.abc import Iterable, Sequence
from typing import Any, Callable

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from coordinator.group.observer import ConsumerRebalance, GroupObserver, RebalanceCategory, RebalanceCause
from coordinator.group.modern.records import CONSUMER_GROUP_RECORD_CLASSES
from coordinator.group.records import GroupMetadataRecord, OffsetCommitRecord, Record
from coordinator.telemetry.event_schema import GROUP_STATES


class GroupCensus:
    """Groups by state and members, for the collector's thread, counted on the event loop (which owns the
    groups: a walk from another thread could see a dict change size mid-scan). Up to `direct_limit` groups they
    are counted in one loop callback (a few ms) the collector waits for (at most `wait_s`, else it gets the last
    figures); above, a scan in slices of `slice_size` groups, one slice per loop iteration, so a scrape never
    holds the loop for O(groups): the figures are then the last finished scan's (a scrape starts the next one)."""

    def __init__(self, coordinator: Any, direct_limit: int = 1_000, slice_size: int = 1_000,
                 wait_s: float = 1.0) -> None:
        self.coordinator = coordinator
        self.direct_limit, self.slice_size, self.wait_s = direct_limit, slice_size, wait_s
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._last: tuple[dict[str, int], int] = ({}, 0)
        self._scanning = False

    def read(self, fresh: bool = True) -> tuple[dict[str, int], int]:
        """`fresh=False`: the figures of the previous read (the second instrument of one collection)."""
        if not fresh:
            return self._last
        if threading.get_ident() == self._loop_thread:
            return self._read_on_loop()
        counted: concurrent.futures.Future[tuple[dict[str, int], int]] = concurrent.futures.Future()
        try:
            self._loop.call_soon_threadsafe(self._answer, counted)
            return counted.result(timeout=self.wait_s)
        except (RuntimeError, concurrent.futures.TimeoutError):  # the loop is closed or too busy to answer now
            return self._last

    def _answer(self, counted: concurrent.futures.Future[tuple[dict[str, int], int]]) -> None:
        if counted.set_running_or_notify_cancel():
            counted.set_result(self._read_on_loop())

    def _read_on_loop(self) -> tuple[dict[str, int], int]:
        groups = self.coordinator.groups
        if len(groups) > self.direct_limit:
            if not self._scanning:
                self._scanning = True
                self._start_scan()
            return self._last
        self._last = _count(list(groups.values()))
        return self._last

    def _start_scan(self) -> None:
        self._loop.create_task(self._scan(), name="group-census")

    async def _scan(self) -> None:
        try:
            snapshot = list(self.coordinator.groups.values())
            by_state: Tally[str] = Tally()
            members = 0
            for start in range(0, len(snapshot), self.slice_size):
                part_states, part_members = _count(snapshot[start:start + self.slice_size])
                by_state.update(part_states)
                members += part_members
                await asyncio.sleep(0)
            self._last = (dict(by_state), members)
        finally:
            self._scanning = False


def _count(groups: list[Any]) -> tuple[dict[str, int], int]:
    by_state = Tally(group.state for group in groups)
    return {state.value: n for state, n in by_state.items()}, sum(len(group.members) for group in groups)


class MetricsObserver(GroupObserver):
    def __init__(self, meter: Meter) -> None:
        self.meter = meter
        self.rebalances = meter.create_counter(
            "coordinator.rebalances", description="Rebalances started, by reason category")
        self.rebalance_duration = meter.create_histogram(
            "coordinator.rebalance.duration", unit="ms",
            description="From PreparingRebalance until Stable or Empty (superseded rebalances included)")
        self.session_expirations = meter.create_counter(
            "coordinator.session.expirations", description="Members removed because their session timed out")
        self.member_failures = meter.create_counter(
            "coordinator.member.failures", description="Members removed by the coordinator, by reason")
        self.members_joined = meter.create_counter("coordinator.members.joined", description="New member ids")
        self.members_left = meter.create_counter("coordinator.members.left", description="LeaveGroup removals")
        self.rebalance_in_progress = meter.create_counter(
            "coordinator.rebalance_in_progress.responses", description="Requests answered REBALANCE_IN_PROGRESS")
        self.offset_commits = meter.create_counter(
            "coordinator.offset.commits", description="Partitions committed")
        self.append_duration = meter.create_histogram(
            "coordinator.state_topic.append.duration", unit="ms",
            description="Appends to the state topic until Kafka acknowledged them")

    # --- group observer -------------------------------------------------------------------------------------
    def on_append_completed(self, group_id: str, partition: int, records: Sequence[Record], duration_ms: float,
                            error: str, by_request: bool) -> None:
        self.append_duration.record(duration_ms, {"record": _record_kind(records),
                                                  "outcome": "ok" if error == "NONE" else "error"})

    def on_rebalance_started(self, group_id: str, generation: int, cause: RebalanceCause) -> None:
        self.rebalances.add(1, {"reason": cause.category.value})

    def on_rebalance_completed(self, group_id: str, generation: int, member_count: int, duration_ms: int) -> None:
        self.rebalance_duration.record(duration_ms, {"outcome": "stable" if member_count else "empty"})

    def on_member_session_expired(self, group_id: str, member_id: str, client_id: str, client_host: str,
                                  session_timeout_ms: int, since_last_heartbeat_ms: int) -> None:
        self.session_expirations.add(1)

    def on_member_failed(self, group_id: str, member_id: str, group_instance_id: str | None, reason: str) -> None:
        self.member_failures.add(1, {"reason": reason})  # a handful of fixed strings in group logic

    def on_member_joined(self, group_id: str, member_id: str, group_instance_id: str | None, client_id: str,
                         client_host: str) -> None:
        self.members_joined.add(1)

    def on_member_left(self, group_id: str, member_id: str, group_instance_id: str | None, reason: str) -> None:
        self.members_left.add(1)

    def on_consumer_rebalance_started(self, group_id: str, rebalance: ConsumerRebalance) -> None:
        self.rebalances.add(1, {"reason": rebalance.cause.category.value})

    def on_consumer_rebalance_completed(self, group_id: str, group_epoch: int, member_count: int,
                                        duration_ms: int | None) -> None:
        if duration_ms is not None:  # a resumed rebalance's duration is not known here
            self.rebalance_duration.record(duration_ms, {"outcome": "stable" if member_count else "empty"})

    def on_consumer_member_joined(self, group_id: str, member_id: str, group_instance_id: str | None,
                                  client_id: str, client_host: str, protocol: str) -> None:
        self.members_joined.add(1)

    def on_consumer_member_left(self, group_id: str, member_id: str, group_instance_id: str | None,
                                reason: str) -> None:
        self.members_left.add(1)

    def on_consumer_member_failed(self, group_id: str, member_id: str, group_instance_id: str | None,
                                  reason: str, category: RebalanceCategory) -> None:
        self.member_failures.add(1, {"reason": category.value})  # the line carries a member id: never a label
        if category is RebalanceCategory.SESSION_TIMEOUT:
            self.session_expirations.add(1)

    def on_rebalance_in_progress(self, group_id: str, member_id: str, api: str) -> None:
        self.rebalance_in_progress.add(1, {"api": api})

    def on_offsets_committed(self, group_id: str, member_id: str, partition_count: int) -> None:
        self.offset_commits.add(partition_count)

    # --- levels read at collection time ---------------------------------------------------------------------
    def watch_coordinator(self, coordinator: Any) -> None:
        """Groups by state, members, heartbeats and the purgatories of a GroupRuntime."""

        census = GroupCensus(coordinator)  # `groups` is registered first, so it is collected first

        def groups(_options: CallbackOptions) -> Iterable[Observation]:
            by_state, _members = census.read()
            return [Observation(by_state.get(state, 0), {"state": state}) for state in GROUP_STATES]

        def members(_options: CallbackOptions) -> Iterable[Observation]:
            return [Observation(census.read(fresh=False)[1])]  # read by `groups` just before

        def heartbeats(_options: CallbackOptions) -> Iterable[Observation]:
            return [Observation(coordinator.heartbeat_count)]

        def purgatory(attribute: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
            def observe(_options: CallbackOptions) -> Iterable[Observation]:
                return [Observation(getattr(p, attribute), {"purgatory": p.name})
                        for p in (coordinator.heartbeat_purgatory, coordinator.rebalance_purgatory)]
            return observe

        meter = self.meter
        meter.create_observable_gauge("coordinator.groups", [groups], description="Groups by state")
        meter.create_observable_gauge("coordinator.members", [members], description="Members of all groups")
        meter.create_observable_counter("coordinator.heartbeats", [heartbeats], description="Heartbeats handled")
        meter.create_observable_gauge("coordinator.purgatory.watched", [purgatory("watched")],
                                      description="Delayed operations watched, per purgatory")
        meter.create_observable_gauge("coordinator.purgatory.delayed", [purgatory("delayed")],
                                      description="Delayed operations waiting in the timer, per purgatory")

    def watch_connections(self, connection_count: Callable[[], int]) -> None:
        self.meter.create_observable_gauge(
            "coordinator.connections", [lambda _options: [Observation(connection_count())]],
            description="Open client connections")

    def watch_runtime_health(self, health: Any) -> None:
        """The event loop's lag probe and the collector monitor (coordinator/runtime_health.py), read on collection."""
        lag, collector = health.lag.counters, health.gc

        def late_ticks(_options: CallbackOptions) -> Iterable[Observation]:
            return [Observation(lag.late)]

        def late_ms(_options: CallbackOptions) -> Iterable[Observation]:
            return [Observation(lag.total_late_ms)]

        def max_lag(_options: CallbackOptions) -> Iterable[Observation]:
            return [Observation(lag.max_lag_ms)]

        def collections(_options: CallbackOptions) -> Iterable[Observation]:
            return [Observation(g.collections, {"generation": str(i)}) for i, g in enumerate(collector.generations)]

        def pauses(_options: CallbackOptions) -> Iterable[Observation]:
            return [Observation(g.total_pause_s * 1000, {"generation": str(i)})
                    for i, g in enumerate(collector.generations)]

        meter = self.meter
        meter.create_observable_counter("coordinator.loop.late_ticks", [late_ticks],
                                        description="Loop-lag probe ticks later than the recording threshold")
        meter.create_observable_counter("coordinator.loop.lag.late", [late_ms], unit="ms",
                                        description="Total lateness of those ticks")
        meter.create_observable_gauge("coordinator.loop.lag.max", [max_lag], unit="ms",
                                      description="Largest loop lag seen since start")
        meter.create_observable_counter("coordinator.gc.collections", [collections],
                                        description="Garbage collections, per generation")
        meter.create_observable_counter("coordinator.gc.pause", [pauses], unit="ms",
                                        description="Time spent in garbage collections, per generation")

    def watch_relay(self, relay: Any) -> None:
        """The relay's forwarded requests and bytes each way, and its buffer pool (coordinator/relay)."""
        counters, pool = relay.counters, relay.pool

        def relayed_bytes(_options: CallbackOptions) -> Iterable[Observation]:
            return [Observation(counters.bytes_to_upstream, {"direction": "to_upstream"}),
                    Observation(counters.bytes_from_upstream, {"direction": "from_upstream"})]

        meter = self.meter
        meter.create_observable_counter("coordinator.relay.requests",
                                        [lambda _options: [Observation(counters.requests)]],
                                        description="Requests relayed to the cluster")
        meter.create_observable_counter("coordinator.relay.bytes", [relayed_bytes], unit="By",
                                        description="Frame bytes relayed, per direction")
        meter.create_observable_gauge("coordinator.relay.buffer.available",
                                      [lambda _options: [Observation(pool.available_bytes)]], unit="By",
                                      description="Relay buffer memory not held by any response")
        meter.create_observable_gauge("coordinator.relay.buffer.waiters",
                                      [lambda _options: [Observation(pool.stats().waiters)]],
                                      description="Relay connections waiting for buffer memory")
        sessions = getattr(getattr(relay, "link_security", None), "tls_sessions", None)
        if sessions is not None:  # TLS to the cluster (coordinator/security/tls_sessions.py)
            meter.create_observable_counter(
                "coordinator.relay.tls.handshakes",
                [lambda _options: [Observation(sessions.handshakes - sessions.resumed, {"session": "new"}),
                                   Observation(sessions.resumed, {"session": "resumed"})]],
                description="TLS handshakes of the relay's connections to brokers: new sessions, resumed ones")

    def watch_acls(self, cache: Any) -> None:
        """The cluster's ACLs in force here (coordinator/security/acl_cache.py): how old they are (the bound on an
        ACL change not yet applied), how many, and the group API checks they refused."""
        authorizer = cache.authorizer

        def age(_options: CallbackOptions) -> Iterable[Observation]:
            return [] if cache.age_ms is None else [Observation(cache.age_ms)]

        meter = self.meter
        meter.create_observable_gauge("coordinator.acls.age", [age], unit="ms",
                                      description="Time since the cluster's ACLs were last read")
        meter.create_observable_gauge("coordinator.acls.count",
                                      [lambda _options: [Observation(authorizer.acls.count, {
                                          "enforcing": authorizer.enforcing})]],
                                      description="ACLs read from the cluster")
        meter.create_observable_counter("coordinator.acls.refused",
                                        [lambda _options: [Observation(authorizer.refused)]],
                                        description="Group API authorization checks refused")

    def watch_sasl_sessions(self, expired: Any) -> None:
        """SASL listeners: connections closed because their session expired without a re-authentication
        (Kafka's expired-connections-killed-count; coordinator/security/sasl_passthrough.py)."""
        self.meter.create_observable_counter(
            "coordinator.connections.expired.killed", [lambda _options: [Observation(expired.killed)]],
            description="Connections closed because their SASL session expired and they were used for anything "
                        "but re-authentication (Kafka: expired-connections-killed-count)")

    def watch_events(self, publisher: Any) -> None:
        """The event topic's producer (coordinator/telemetry/events.py): events by outcome, and those waiting."""

        def events(_options: CallbackOptions) -> Iterable[Observation]:
            return [Observation(publisher.delivered, {"outcome": "delivered"}),
                    Observation(publisher.failed, {"outcome": "failed"}),
                    Observation(publisher.dropped, {"outcome": "dropped"})]

        meter = self.meter
        meter.create_observable_counter("coordinator.events", [events],
                                        description="Group events for the event topic: delivered, failed (not "
                                                    "delivered within the delivery timeout), dropped (queue full)")
        meter.create_observable_gauge("coordinator.events.queued",
                                      [lambda _options: [Observation(publisher.queued)]],
                                      description="Group events waiting for the event topic")


def _record_kind(records: Sequence[Record]) -> str:
    """group: a group's metadata; consumer_group: a KIP-848 group's records; offsets: committed offsets;
    tombstones: deletions only."""
    if any(isinstance(r, CONSUMER_GROUP_RECORD_CLASSES) for r in records):
        return "consumer_group"
    if any(isinstance(r, GroupMetadataRecord) and r.value is not None for r in records):
        return "group"
    offsets = (r for r in records if isinstance(r, OffsetCommitRecord))
    return "offsets" if any(r.value is not None for r in offsets) else "tombstones"
