"""Which instance owns which state-topic partition, as every instance sees it: the answer behind FindCoordinator
and Metadata when several instances share one state topic.

The instances are the members of one Kafka consumer group (coordinator/cluster/membership.py), each with its
endpoint in its client.id (coordinator/cluster/identity.py). One DescribeGroups of that group is the whole map:

    member client.id ─ parse_client_id ─► InstanceEndpoint          (the live instances)
    member assignment of the state topic ─► partition → endpoint     (the owners)

It is read every `refresh_ms`, and soon after `refresh_soon()` (the membership consumer calls it when the group
rebalances; calls in a burst make one read). Between reads the map may be stale, which is harmless: a client
sent to an instance that lost the partition gets NOT_COORDINATOR and asks again. What must never be stale is our
own part, so it comes from the membership callbacks (`set_own`) and not from Kafka:
- a partition we were assigned is ours at once, whatever an older description says;
- a partition the description gives us but we no longer hold (revoked) has an unknown owner until Kafka says
  whose it is now.
Unknown (None) is also the answer for a partition two members claim (a description taken mid-rebalance), and
for the partitions of a member that has left. During a rebalance Kafka describes the members without their
assignments; the map then keeps the last assignment it saw of each member still in the group (with the
cooperative protocol they keep serving those partitions until they revoke them).

The same thread also answers `describe_fresh()`, the zombie guard's confirmation (ownership.py): a description
taken for the caller, after it asked, never the cached map nor an answer to a request sent before (one sent
before a stall would describe the group as it was before the stall). It is the instance's one AdminClient and
describe path: the guard has no client of its own.

Threads: the AdminClient blocks and librdkafka must not destroy a client on one of its own threads, so one
thread of ours creates the client, makes every call and destroys it (`_admin` is the only reference: no frame or
traceback holds the client). Results go to the event loop, which alone owns the map and the callers' futures.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from coordinator.cluster.identity import InstanceEndpoint, parse_client_id
from coordinator.security.clusters import secured
from coordinator.storage.kafka_logs import librdkafka_logger

log = logging.getLogger("coordinator.cluster")

_MIN_INTERVAL_S = 0.2  # refresh_soon() bursts within this make one DescribeGroups (describe_fresh() waits none)
_DESCRIBE_TIMEOUT_S = 5.0
_CLOSE_TIMEOUT_S = _DESCRIBE_TIMEOUT_S + 5.0
_FAILURES_TO_WARN = 3


@dataclass(frozen=True, slots=True)
class DescribedMember:
    """One member of the instances group as DescribeGroups shows it: only what the map needs."""

    member_id: str
    client_id: str
    partitions: tuple[int, ...] | None  # of the state topic; None: described without an assignment (rebalancing)


@dataclass(frozen=True, slots=True)
class Described:
    members: tuple[DescribedMember, ...]
    stable: bool


@dataclass
class OwnerView:
    """The merged map: what `owner()` and `instances()` answer from."""

    owners: dict[int, InstanceEndpoint] = field(default_factory=dict)
    instances: tuple[InstanceEndpoint, ...] = ()
    contested: frozenset[int] = frozenset()  # claimed by two members
    node_id_clashes: tuple[tuple[InstanceEndpoint, ...], ...] = ()  # distinct instances sharing one node id


def described_members(description: Any, topic: str) -> Described:
    """A confluent-kafka ConsumerGroupDescription, reduced to the state topic's assignment per member."""
    state = getattr(description.state, "name", str(description.state))
    stable = state.upper() == "STABLE"
    members = []
    for member in description.members:
        partitions: tuple[int, ...] | None = None
        assigned = member.assignment.topic_partitions if member.assignment is not None else None
        if stable or assigned:
            partitions = tuple(sorted(tp.partition for tp in assigned or () if tp.topic == topic))
        members.append(DescribedMember(member.member_id, member.client_id, partitions))
    return Described(tuple(members), stable)


def merge(described: Described, last_assignments: Mapping[str, tuple[int, ...]], me: InstanceEndpoint,
          own: Collection[int], num_partitions: int) -> tuple[OwnerView, dict[str, tuple[int, ...]]]:
    """The owner map from one description, the assignments last seen per member id and our own partitions.
    Returns it with the assignments to remember for the next description."""
    assignments: dict[str, tuple[int, ...]] = {}
    claims: dict[int, set[InstanceEndpoint]] = {}
    endpoints: set[InstanceEndpoint] = {me}
    for member in described.members:
        endpoint = parse_client_id(member.client_id)
        if endpoint is None:
            continue  # not an instance (a tool joined the group?): it owns nothing we can send clients to
        endpoints.add(endpoint)
        partitions = member.partitions
        if partitions is None:
            partitions = last_assignments.get(member.member_id, ())
        assignments[member.member_id] = partitions
        if endpoint == me:
            continue  # our own part comes from set_own(), never from a possibly older description
        for partition in partitions:
            if 0 <= partition < num_partitions:
                claims.setdefault(partition, set()).add(endpoint)
    owners = {p: next(iter(c)) for p, c in claims.items() if len(c) == 1}
    contested = frozenset(p for p, c in claims.items() if len(c) > 1 and p not in own)
    for partition in own:
        owners[partition] = me
    by_node: dict[int, list[InstanceEndpoint]] = {}
    for endpoint in endpoints:
        by_node.setdefault(endpoint.node_id, []).append(endpoint)
    clashes = tuple(tuple(sorted(group, key=_order)) for group in by_node.values()
                    if len({e.instance_id for e in group}) > 1)
    view = OwnerView(owners, tuple(sorted(endpoints, key=_order)), contested, clashes)
    return view, assignments


def _order(endpoint: InstanceEndpoint) -> tuple[int, str, str, int]:
    return (endpoint.node_id, endpoint.instance_id, endpoint.host, endpoint.port)


class OwnerMap:
    """The live instances and the owner of every state-topic partition (see the module docstring)."""

    def __init__(self, bootstrap: str, group_id: str, topic: str, num_partitions: int, me: InstanceEndpoint,
                 refresh_ms: int = 1000) -> None:
        self.bootstrap = bootstrap
        self.group_id = group_id
        self.topic = topic
        self.num_partitions = num_partitions
        self.me = me
        self.refresh_ms = refresh_ms
        self._own: frozenset[int] = frozenset()
        self._described = Described((), stable=False)
        self._last_assignments: dict[str, tuple[int, ...]] = {}
        self._view = OwnerView(instances=(me,))
        self._reported_clashes: tuple[tuple[InstanceEndpoint, ...], ...] = ()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        with contextlib.suppress(RuntimeError):  # made on the loop (as app.py does): set_own works before start()
            self._bind_loop()
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()
        self._urgent = threading.Event()  # a describe_fresh() caller waits: no pause between descriptions
        self._stopping = threading.Event()
        self._waiters_lock = threading.Lock()
        self._waiters: list[asyncio.Future[Described]] = []  # describe_fresh() callers (futures of the loop)
        self._closed = False  # the thread has ended: describe_fresh() fails at once
        self._admin: Any = None  # the AdminClient; only the refresh thread touches it
        self._failures = 0  # descriptions failed in a row (one WARNING per run, once it is not a blip)

    # ------------------------------------------------------------------------------------------ answers

    def owner(self, partition: int) -> InstanceEndpoint | None:
        """The instance serving `partition`; None while it is unknown (moving, contested, owner gone)."""
        return self._view.owners.get(partition)

    def instances(self) -> list[InstanceEndpoint]:
        """Every live instance, this one included, by node id."""
        return list(self._view.instances)

    @property
    def own(self) -> frozenset[int]:
        return self._own

    # ------------------------------------------------------------------------------------------ updates

    def set_own(self, partitions: Collection[int]) -> None:
        """Our assignment, from the membership callbacks: it replaces the previous one at once (any thread)."""
        own = frozenset(partitions)
        if self._loop is not None and threading.get_ident() != self._loop_thread:
            self._loop.call_soon_threadsafe(self._set_own, own)
        else:
            self._set_own(own)

    def refresh_soon(self) -> None:
        """Describe the group again now (or once the last description is `_MIN_INTERVAL_S` old); any thread."""
        self._wake.set()

    async def describe_fresh(self) -> Described:
        """DescribeGroups of the instances group sent after this call (see the module docstring); raises what
        the description raised (Kafka unreachable, timeout) or RuntimeError once the map is closed."""
        future: asyncio.Future[Described] = asyncio.get_running_loop().create_future()
        with self._waiters_lock:
            if self._thread is None or self._closed:
                raise RuntimeError(f"the owner map of {self.group_id} is not running")
            self._waiters.append(future)
        self._urgent.set()
        self._wake.set()
        return await future

    def _set_own(self, own: frozenset[int]) -> None:
        self._own = own
        self._rebuild()

    def _apply(self, described: Described) -> None:
        self._described = described
        self._rebuild()

    def _rebuild(self) -> None:
        before = self._view
        self._view, self._last_assignments = merge(self._described, self._last_assignments, self.me, self._own,
                                                   self.num_partitions)
        self._report(before, self._view)

    def _report(self, before: OwnerView, after: OwnerView) -> None:
        if before.instances != after.instances:
            log.info("event=instances_changed group=%s instances=%s", self.group_id,
                     ",".join(f"{e.instance_id}@{e.host}:{e.port}/{e.node_id}" for e in after.instances))
        if after.node_id_clashes and after.node_id_clashes != self._reported_clashes:
            for clash in after.node_id_clashes:
                log.error("event=node_id_clash node_id=%d instances=%s (clients cannot tell them apart: give each "
                          "instance its own --node-id)", clash[0].node_id, ",".join(e.instance_id for e in clash))
        self._reported_clashes = after.node_id_clashes
        if log.isEnabledFor(logging.DEBUG) and before.owners != after.owners:
            log.debug("event=owner_map_changed group=%s known=%d unknown=%d contested=%s", self.group_id,
                      len(after.owners), self.num_partitions - len(after.owners), sorted(after.contested))

    # ------------------------------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Start refreshing (the first description is taken at once; answers meanwhile: our own partitions)."""
        if self._thread is not None:
            return
        self._bind_loop()
        self._stopping.clear()
        self._closed = False
        self._wake.set()
        self._thread = threading.Thread(target=self._run, name=f"owner-map-{self.group_id}", daemon=True)
        self._thread.start()

    def _bind_loop(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()

    async def close(self) -> None:
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stopping.set()
        self._urgent.set()
        self._wake.set()
        await asyncio.to_thread(thread.join, _CLOSE_TIMEOUT_S)
        if thread.is_alive():
            log.warning("event=owner_map_close_slow group=%s after_s=%.0f", self.group_id, _CLOSE_TIMEOUT_S)

    def _run(self) -> None:
        try:
            self._admin = self._open_admin()
            while not self._stopping.is_set():
                self._wake.wait(self.refresh_ms / 1000)
                if self._stopping.is_set():
                    break
                self._wake.clear()
                self._urgent.clear()
                self._refresh_once()
                self._urgent.wait(_MIN_INTERVAL_S)
        except Exception:
            log.exception("event=owner_map_thread_failed group=%s", self.group_id)
        finally:
            self._admin = None  # destroyed here, on our thread (see the module docstring)
            with self._waiters_lock:
                self._closed = True
                waiters, self._waiters = self._waiters, []
            if waiters:
                self._to_loop(_settle, waiters, None, RuntimeError(f"the owner map of {self.group_id} closed"))

    def _open_admin(self) -> Any:
        from confluent_kafka.admin import AdminClient

        # Any: confluent-kafka's stubs allow only scalar values, but a "logger" object is part of its API
        settings: dict[str, Any] = {"bootstrap.servers": self.bootstrap,
                                    "client.id": f"group-coordinator-owner-map-{self.me.instance_id}",
                                    "logger": librdkafka_logger("owner-map")}
        return AdminClient(secured(settings))

    def _refresh_once(self) -> None:
        with self._waiters_lock:  # those who asked before this request is sent: it answers them
            waiters, self._waiters = self._waiters, []
        try:
            described = self._describe()
        except Exception as exc:  # Kafka unreachable, timeout: keep the last map, try again next time
            self._failures += 1
            # a blip (the broker's own group coordinator loading or moving) is only worth a DEBUG line
            level = logging.WARNING if self._failures == _FAILURES_TO_WARN else logging.DEBUG
            log.log(level, "event=owner_map_refresh_failed group=%s failures=%d error=%s (keeping the last map)",
                    self.group_id, self._failures, _one_line(exc))
            if waiters:  # without its traceback: its frames hold `waiters`, which would hold it (a cycle)
                self._to_loop(_settle, waiters, None, exc.with_traceback(None))
            return
        if self._failures >= _FAILURES_TO_WARN:
            log.info("event=owner_map_refreshed_again group=%s after_failures=%d", self.group_id, self._failures)
        self._failures = 0
        self._to_loop(self._apply, described)
        if waiters:
            self._to_loop(_settle, waiters, described, None)

    def _to_loop(self, callback: Any, *args: Any) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(callback, *args)
            except RuntimeError:  # the loop closed meanwhile
                pass

    def _describe(self) -> Described:
        futures = self._admin.describe_consumer_groups([self.group_id], request_timeout=_DESCRIBE_TIMEOUT_S)
        try:
            description = futures[self.group_id].result(_DESCRIBE_TIMEOUT_S + 1)
        except KafkaException as exc:
            if exc.args and getattr(exc.args[0], "code", lambda: None)() == KafkaError.GROUP_ID_NOT_FOUND:
                return Described((), stable=False)  # no instance has joined yet
            raise
        return described_members(description, self.topic)


def _settle(waiters: list[asyncio.Future[Described]], described: Described | None,
            error: BaseException | None) -> None:
    """On the loop: answers the describe_fresh() callers (those cancelled meanwhile are skipped)."""
    for future in waiters:
        if future.done():
            continue
        if error is not None:
            future.set_exception(error)
        else:
            assert described is not None
            future.set_result(described)


def _one_line(exc: BaseException) -> str:
    return (str(exc) or type(exc).__name__).splitlines()[0]

