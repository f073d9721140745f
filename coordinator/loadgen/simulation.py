"""A population of simulated consumers against any Kafka-protocol group coordinator, with failure injection.

`Simulation(options).run()` creates the topic if needed (Kafka admin, when a bootstrap server is given), starts
G groups × M members, injects failures on schedule or at random (seeded), runs for the duration, then lets the
population settle (every surviving member Stable, every failed member back) and returns a summary.

Failures (each on a member that is Stable at that moment):
- crash: the connection is dropped without a LeaveGroup; the member comes back after `downtime`
  (default: session timeout + 3 s), first probing with its old member id (UNKNOWN_MEMBER_ID = detected).
- hang: the connection stays open but nothing is sent (Kafka's "has failed" path); back after `downtime`,
  probing the same way.
- slow: the member's next rejoin waits half the rebalance timeout (it must not be removed).
- leave: a clean LeaveGroup, back as a new member a moment later.
- static-restart (static members): connection dropped, back with the same group.instance.id well within the
  session timeout (no rebalance for it in Kafka; it must not be removed).
A coordinator restart needs nothing injected: members reconnect, rediscover and back off on LOAD_IN_PROGRESS.

Discovery follows FindCoordinator like a real client: one lookup connection to any of the coordinators given
(the next one when it fails, backing off once all have failed), one lookup at a time per group (the members of a
group that lose their coordinator together ask once), and a member connects to the address answered. A member
forgets that answer on NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE or a failed connection, so with several
coordinator instances it follows its group when the group moves, and an instance that died (connection refused)
is only retried while FindCoordinator still names it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import heapq
import logging
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from protocol.client import KafkaClient
from protocol.error_codes import Errors
from protocol.errors import ConnectionClosed, ProtocolError, RequestTimedOut

import coordinator.loadgen.wire as wire
from coordinator.loadgen.events import ExpiryWatcher
from coordinator.loadgen.member import SimMember
from coordinator.loadgen.options import FAILURE_KINDS, ScheduledFailure, SimOptions  # the latter two re-exported
from coordinator.loadgen.real import RealClients
from coordinator.loadgen.stats import GroupRounds, Stats, error_name, summary_of

log = logging.getLogger("coordinator.loadgen")

DETECTED_KINDS = frozenset({"crash", "hang"})
_DISCOVERY_BACKOFF_S = 0.1
_DISCOVERY_MAX_BACKOFF_S = 2.0
_DISCOVERY_TIMEOUT_MS = 5_000  # a FindCoordinator (or its connect) that takes longer: ask another instance


@dataclass
class Progress:
    elapsed_s: float
    members: int
    members_stable: int
    groups: int
    groups_stable: int
    rebalances_in_flight: int
    rebalances_done: int
    failures_injected: int
    failures_detected: int
    unexpected_errors: int
    real: str = ""  # the real consumers, one short line


class Simulation:
    def __init__(self, options: SimOptions) -> None:
        self.options = options
        self.stats = Stats()
        self.random = random.Random(options.seed)
        self.rounds = {group_id: GroupRounds(group_id) for group_id in options.group_ids()}
        self.members: list[SimMember] = []
        self.partition_counts = {options.topic: options.partitions}
        self.connect_slots = asyncio.Semaphore(options.max_connecting)
        self._coordinators: dict[str, tuple[str, int]] = {}
        self._lookups: dict[str, asyncio.Future[tuple[str, int]]] = {}  # FindCoordinator in flight per group
        self._discovery: KafkaClient | None = None
        self._discovery_lock = asyncio.Lock()
        self._discovery_next = 0  # index into discovery_addresses of the next lookup connection
        self._away: set[SimMember] = set()  # failed members not back yet
        self._pending: set[asyncio.Task[None]] = set()
        self._started = time.monotonic()
        self.watcher: ExpiryWatcher | None = None
        self.real: RealClients | None = None

    # ------------------------------------------------------------------------------------------------ running

    async def run(self, on_progress: Callable[[Progress], None] | None = None) -> dict[str, Any]:
        options = self.options
        if options.bootstrap_server:
            self.partition_counts[options.topic] = await asyncio.to_thread(
                ensure_topic, options.bootstrap_server, options.topic, options.partitions,
                settings=self._cluster_settings)
        if options.event_topic and options.bootstrap_server:
            self.watcher = ExpiryWatcher(options.bootstrap_server, options.event_topic, set(self.rounds),
                                         settings=self._cluster_settings)
            await asyncio.to_thread(self.watcher.start)
        self.start_members()
        if options.real > 0:
            self.real = RealClients(options.bootstrap_text, options.topic, options.real, f"{options.group_prefix}-real",
                                    security=options.security)
            self.real.start()
        injector = asyncio.create_task(self._inject_failures())
        try:
            await self._tick_until(time.monotonic() + options.duration_s, on_progress, lambda: False)
            injector.cancel()
            await asyncio.gather(injector, return_exceptions=True)
            settle_by = time.monotonic() + options.settle_timeout_s
            await self._tick_until(settle_by, on_progress, self._settled)
            if self.watcher is not None:
                await self._tick_until(time.monotonic() + 10, on_progress, self._expiries_arrived)
            return self.summary()
        finally:
            injector.cancel()
            await self.close()

    def start_members(self) -> None:
        self._started = time.monotonic()
        for group_id in self.options.group_ids():
            for index in range(self.options.members):
                member = SimMember(self, group_id, index, self.options.static)
                self.members.append(member)
                member.start("new member")

    def all_stable(self) -> bool:
        """Every member Stable in its group's one current generation, no rebalance in flight."""
        return all(m.state == "stable" for m in self.members) and self._one_generation_per_group() and not any(
            r.in_flight for r in self.rounds.values())

    def _one_generation_per_group(self) -> bool:
        """The stable members of each group agree on its generation (a member still in an older one has not
        heard of the latest rebalance yet: its next heartbeat will tell it)."""
        generations: dict[str, set[int]] = collections.defaultdict(set)
        for member in self.members:
            if member.state == "stable":
                generations[member.group_id].add(member.generation)
        return all(len(g) == 1 for g in generations.values())

    async def _tick_until(self, deadline: float, on_progress: Callable[[Progress], None] | None,
                          done: Callable[[], bool]) -> None:
        while time.monotonic() < deadline and not done():
            if on_progress is not None:
                on_progress(self.progress())
            await asyncio.sleep(0.25)
        if on_progress is not None:
            on_progress(self.progress())

    def _settled(self) -> bool:
        """Every member back and Stable, and every group's partitions owned exactly once. A member that has not
        yet heard of a restart or rebalance still holds its old partitions (even in a generation of the same
        number, after a coordinator restart without state): settling waits for its next heartbeat to send it
        back to rejoin; what is still misassigned when the settle timeout ends is reported."""
        return not self._away and not self._pending and all(
            m.state in ("stable", "stopped") for m in self.members) and self._one_generation_per_group() and not any(
            r.in_flight for r in self.rounds.values()) and not self._misassigned_groups()

    def _expiries_arrived(self) -> bool:
        assert self.watcher is not None
        self._apply_expiries()
        return all(f.expired_at_ms for f in self.stats.failures if f.expect_detection and f.detected)

    async def close(self) -> None:
        """Stop every member (dynamic ones send LeaveGroup, as a closing consumer does); bounded in time."""
        for task in list(self._pending):
            task.cancel()
        await _bounded(self._pending, "failure injections")
        await _bounded([asyncio.ensure_future(m.halt(abort=False)) for m in self.members], "members")
        if self.options.leave_on_exit and not self.options.static:
            await _bounded([asyncio.ensure_future(m.leave()) for m in self.members if m.state == "stable"], "leaves")
        await _bounded([asyncio.ensure_future(m.drop_connection()) for m in self.members], "connections")
        for lookup in list(self._lookups.values()):
            lookup.cancel()
        await self.close_discovery()
        if self.real is not None:
            await self.real.stop()
        if self.watcher is not None:
            await asyncio.to_thread(self.watcher.stop)

    # ------------------------------------------------------------------------------------------------ discovery

    async def find_coordinator(self, group_id: str) -> tuple[str, int]:
        """The address of `group_id`'s coordinator: remembered, or looked up (once for all members asking)."""
        known = self._coordinators.get(group_id)
        if known is not None:
            return known
        lookup = self._lookups.get(group_id)
        if lookup is None:
            lookup = asyncio.ensure_future(self._look_up(group_id))
            self._lookups[group_id] = lookup
            lookup.add_done_callback(lambda done: self._lookup_done(group_id, done))
        return await asyncio.shield(lookup)  # a member halted meanwhile does not cancel the others' lookup

    def _lookup_done(self, group_id: str, lookup: asyncio.Future[tuple[str, int]]) -> None:
        if self._lookups.get(group_id) is lookup:
            del self._lookups[group_id]
        if not lookup.cancelled():
            lookup.exception()  # retrieved: a cancelled member must not leave "exception never retrieved"

    async def _look_up(self, group_id: str) -> tuple[str, int]:
        backoff_s = _DISCOVERY_BACKOFF_S
        while True:
            client: KafkaClient | None = None
            try:
                client = await self._discovery_client()
                response = await client.request(wire.find_coordinator(client, group_id),
                                                timeout_ms=self._discovery_timeout_ms)
            except (ConnectionClosed, RequestTimedOut, ProtocolError, OSError, asyncio.TimeoutError) as exc:
                # this instance is down or stuck: the next lookup connection goes to the next one
                log.debug("event=discovery_failed group=%s error=%r", group_id, exc)
                self.stats.connection_errors += 1
                await self._discovery_failed(client)
                await asyncio.sleep(backoff_s * (0.5 + self.random.random()))
                backoff_s = min(backoff_s * 2, _DISCOVERY_MAX_BACKOFF_S)
                continue
            code = int(response.error_code)
            self.stats.record("FindCoordinator", code)
            if code == Errors.NONE:
                address = (response.host, int(response.port))
                self._coordinators[group_id] = address
                return address
            loading = code in (Errors.COORDINATOR_NOT_AVAILABLE, Errors.COORDINATOR_LOAD_IN_PROGRESS)
            await asyncio.sleep(0.2 if loading else 1.0)

    async def close_discovery(self) -> None:
        if self._discovery is not None:
            await self._discovery.close()
            self._discovery = None

    def forget_coordinator(self, group_id: str, address: tuple[str, int] | None = None) -> None:
        """Look the group's coordinator up again next time. With `address` (the one that failed) only if that
        is still the answer remembered: a member that saw the old coordinator fail late must not wipe out the
        answer its group mates already found."""
        if address is None or self._coordinators.get(group_id) == address:
            self._coordinators.pop(group_id, None)

    async def _discovery_client(self) -> KafkaClient:
        async with self._discovery_lock:
            if self._discovery is None or self._discovery.is_closed:
                addresses = self.options.discovery_addresses
                host, port = addresses[self._discovery_next % len(addresses)]
                self._discovery_next += 1  # a failed connect moves on to the next one
                self._discovery = await self.connect(host, port, self._discovery_timeout_ms)
            return self._discovery

    async def connect(self, host: str, port: int, timeout_ms: int) -> KafkaClient:
        """A connection to a coordinator, authenticated when the simulation is secured."""
        if self.options.security is None:
            return await KafkaClient.connect(host, port, client_id=self.options.client_id, timeout_ms=timeout_ms)
        from coordinator.security.connections import connect

        return await connect(host, port, self.options.security, client_id=self.options.client_id,
                             timeout_ms=timeout_ms)

    @property
    def _cluster_settings(self) -> dict[str, str]:
        """The librdkafka security settings of the simulation's own Kafka clients."""
        return dict(self.options.security.librdkafka) if self.options.security is not None else {}

    async def _discovery_failed(self, client: KafkaClient | None) -> None:
        if client is not None and self._discovery is client:
            self._discovery = None
            await client.abort()

    @property
    def _discovery_timeout_ms(self) -> int:
        # a stopped (SIGSTOP) instance accepts connections but never answers: don't wait a full request timeout
        return min(self.options.request_timeout_ms, _DISCOVERY_TIMEOUT_MS)

    # ------------------------------------------------------------------------------------------------ failures

    async def _inject_failures(self) -> None:
        options = self.options
        scheduled = sorted((s.at_s, s.kind, s.count) for s in options.schedule)

        def random_failures() -> Iterator[tuple[float, str, int]]:  # drawn as they come: a demo runs for years
            at = 0.0
            while options.failure_rate_per_min > 0:
                at += self.random.expovariate(options.failure_rate_per_min / 60)
                if at >= options.duration_s:
                    return
                yield at, self.random.choice(options.failure_kinds), 1

        for at_s, kind, count in heapq.merge(scheduled, random_failures()):
            await asyncio.sleep(max(0.0, self._started + at_s - time.monotonic()))
            for _ in range(count):
                member = await self._wait_for_victim(kind)
                if member is None:
                    log.warning("event=no_member_to_fail kind=%s (none Stable before the end)", kind)
                    continue
                self._away.add(member)  # now, not when the injection task runs: the next pick must not take it
                self._spawn(self.inject(member, kind))

    async def _wait_for_victim(self, kind: str) -> SimMember | None:
        """A Stable member to fail now, or as soon as there is one (a busy machine may still be forming groups
        at the scheduled time); None if none turns up before the end of the run."""
        end = self._started + self.options.duration_s
        while (member := self._pick_victim(kind)) is None and time.monotonic() < end:
            await asyncio.sleep(0.1)
        return member

    def _pick_victim(self, kind: str) -> SimMember | None:
        candidates = [m for m in self.members if m.state == "stable" and m.beating and m not in self._away
                      and (kind != "static-restart" or m.instance_id is not None)]
        return self.random.choice(candidates) if candidates else None

    async def inject(self, member: SimMember, kind: str) -> None:
        options = self.options
        failure = member.failure_record(kind, expect_detection=kind in DETECTED_KINDS)
        self.stats.failures.append(failure)
        self._away.add(member)
        log.info("event=failure_injected kind=%s group=%s member=%s", kind, member.group_id, member.member_id)
        try:
            if kind == "slow":
                member.slow_join_ms = options.rebalance_ms // 2
                return
            if kind == "leave":
                await member.halt(abort=False)
                await member.leave()
                member.state = "failed"
                await asyncio.sleep(1.0)
                member.start("new member after leave")
                return
            member.state = "failed"
            await member.halt(abort=kind != "hang")
            if kind == "static-restart":
                await asyncio.sleep(min(1.0, options.session_ms / 4000))
                member.member_id = ""  # a restarted static member knows only its group.instance.id
                member.start("static member restart")
                return
            await asyncio.sleep(options.failure_downtime_ms / 1000)
            member.start("rejoin", probe=failure)
        finally:
            self._away.discard(member)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    def _apply_expiries(self) -> None:
        if self.watcher is None:
            return
        expiries = self.watcher.expiries()
        for failure in self.stats.failures:
            failure.expired_at_ms = list(expiries.get((failure.group_id, failure.member_id), ()))

    # ------------------------------------------------------------------------------------------------ reporting

    def progress(self) -> Progress:
        members_stable = sum(1 for m in self.members if m.state == "stable")
        by_group: dict[str, list[SimMember]] = collections.defaultdict(list)
        for member in self.members:
            by_group[member.group_id].append(member)
        groups_stable = sum(1 for group_id, members in by_group.items()
                            if not self.rounds[group_id].in_flight
                            and all(m.state == "stable" for m in members)
                            and len({m.generation for m in members}) == 1)
        return Progress(time.monotonic() - self._started, len(self.members), members_stable, len(by_group),
                        groups_stable, sum(1 for r in self.rounds.values() if r.in_flight),
                        len(self.stats.rebalances), len(self.stats.failures),
                        sum(1 for f in self.stats.failures if f.detected), sum(self.stats.unexpected.values()),
                        self.real.status() if self.real is not None else "")

    def summary(self) -> dict[str, Any]:
        options = self.options
        self._apply_expiries()
        progress = self.progress()
        by_reason = collections.Counter(r.reason for r in self.stats.rebalances)
        failures = self.stats.failures
        detectable = [f for f in failures if f.expect_detection]
        undetected = [f.member_key for f in detectable if f.detected != 1]
        removed_wrongly = [f.member_key for f in failures
                           if not f.expect_detection and f.probe_code == Errors.UNKNOWN_MEMBER_ID]
        lateness = [x for f in detectable if (x := f.lateness_ms(options.session_ms)) is not None]
        expiry_counts = [len(f.expired_at_ms) for f in detectable]
        errors: dict[str, dict[str, int]] = collections.defaultdict(dict)
        for (api, code), count in sorted(self.stats.errors.items()):
            errors[api][error_name(code)] = count
        unexpected = {f"{api} {error_name(code)}": n for (api, code), n in sorted(self.stats.unexpected.items())}
        misassigned = self._misassigned_groups()
        surviving = [m for m in self.members if m.state != "stopped"]
        stable = [m for m in surviving if m.state == "stable"]
        ok = (len(stable) == len(surviving) and not undetected and not removed_wrongly and not unexpected
              and not misassigned
              and (self.watcher is None or all(n == 1 for n in expiry_counts)))
        return {
            "coordinator": options.bootstrap_text,
            "groups": options.groups, "members_per_group": options.members, "static": options.static,
            "assignor": options.assignor, "session_ms": options.session_ms, "rebalance_ms": options.rebalance_ms,
            "heartbeat_ms": options.heartbeat_ms, "elapsed_s": round(progress.elapsed_s, 1),
            "members": len(self.members), "members_surviving": len(surviving), "members_stable": len(stable),
            "groups_stable": progress.groups_stable,
            "groups_misassigned": misassigned,
            "unstable_members_by_phase": dict(collections.Counter(m.phase for m in surviving if m.state != "stable")),
            "heartbeats": self.stats.heartbeats, "commits": self.stats.commits,
            "reconnects": self.stats.connection_errors,
            "members_by_coordinator": self._members_by_coordinator(),
            "rebalances": {"count": len(self.stats.rebalances), "by_reason": dict(by_reason.most_common()),
                           "duration_ms": _rounded(summary_of([r.duration_ms for r in self.stats.rebalances]))},
            "failures": {
                "injected": dict(collections.Counter(f.kind for f in failures)),
                "to_detect": len(detectable),
                "detected_once": sum(1 for f in detectable if f.detected == 1),
                "undetected": undetected,
                "removed_but_should_not_be": removed_wrongly,
                "expiry_events_per_failure": expiry_counts if self.watcher is not None else None,
            },
            "detection_lateness_ms": {
                "source": (f"event topic {options.event_topic} (member_failed ts_ms, 1 ms resolution)"
                           if self.watcher is not None else "not measured (needs --event-topic and our coordinator)"),
                **_rounded(summary_of(lateness)),
            },
            "error_codes": dict(errors),
            "unexpected_errors": unexpected,
            "real_consumers": self.real.summary() if self.real is not None else None,
            "ok": ok,
        }


    def _members_by_coordinator(self) -> dict[str, int]:
        """Where FindCoordinator last sent the members (several instances: how the groups are spread)."""
        where = collections.Counter(f"{m.coordinator[0]}:{m.coordinator[1]}" for m in self.members
                                    if m.coordinator is not None and m.state != "stopped")
        return dict(sorted(where.items()))

    def _misassigned_groups(self) -> list[str]:
        """Stable groups whose members do not own every partition of the topic exactly once."""
        expected = sorted((self.options.topic, p) for p in range(self.partition_counts[self.options.topic]))
        by_group: dict[str, list[tuple[str, int]]] = collections.defaultdict(list)
        unstable = {m.group_id for m in self.members if m.state != "stable"}
        for member in self.members:
            by_group[member.group_id].extend((t, p) for t, ids in member.owned for p in ids)
        return [g for g, owned in by_group.items() if g not in unstable and sorted(owned) != expected]


async def _bounded(tasks: Any, what: str, timeout_s: float = 15.0) -> None:
    tasks = [t for t in tasks if t is not None]
    if not tasks:
        return
    _done, pending = await asyncio.wait(tasks, timeout=timeout_s)
    if pending:
        log.warning("event=shutdown_slow what=%s still_running=%d after_s=%.0f", what, len(pending), timeout_s)
        for task in pending:
            task.cancel()


def _rounded(values: dict[str, Any]) -> dict[str, Any]:
    return {k: (round(v, 1) if isinstance(v, float) else v) for k, v in values.items()}


def ensure_topic(bootstrap: str, topic: str, partitions: int, timeout_s: float = 30, *,
                 settings: dict[str, str] | None = None) -> int:
    """Create `topic` if missing (replication min(3, brokers)); its partition count either way. `settings`: the
    admin client's security (librdkafka names)."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3, **(settings or {})})
    metadata = admin.list_topics(timeout=timeout_s)
    if topic not in metadata.topics or metadata.topics[topic].error is not None:
        replication = min(3, len(metadata.brokers))
        future = admin.create_topics([NewTopic(topic, partitions, replication)])[topic]
        with contextlib.suppress(KafkaException):  # created meanwhile by someone else: fine
            future.result(timeout_s)
        for _ in range(int(timeout_s * 10)):
            metadata = admin.list_topics(topic, timeout=timeout_s)
            if metadata.topics[topic].error is None and metadata.topics[topic].partitions:
                break
            time.sleep(0.1)
    return len(metadata.topics[topic].partitions)

