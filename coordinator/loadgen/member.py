"""One simulated consumer: the classic group protocol as Kafka's consumer runs it, over its own connection.

Loop: find the coordinator → JoinGroup (again with the id on MEMBER_ID_REQUIRED) → the leader assigns → SyncGroup
→ heartbeat every interval and commit progress, until an answer says to rejoin. Like a real client it
- rejoins on REBALANCE_IN_PROGRESS, ILLEGAL_GENERATION and UNKNOWN_MEMBER_ID (the last two after resetting its
  generation, UNKNOWN_MEMBER_ID also its member id);
- rediscovers the coordinator on NOT_COORDINATOR / COORDINATOR_NOT_AVAILABLE, and when its connection fails
  (with several coordinator instances, the group may have moved to another one);
- backs off and retries on COORDINATOR_LOAD_IN_PROGRESS;
- reconnects when the connection drops or a request times out, keeping its member id and generation (so a
  restarted coordinator that kept its groups sees the same member heartbeat again).

Why one connection per member: the coordinator, like Kafka's broker, handles one request per connection at a
time, so a JoinGroup parked until the rebalance completes would hold back every other member's request on a
shared connection (and their sessions would expire behind it). Real clients use one coordinator connection each.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from typing import Any, Protocol

from protocol.client import KafkaClient
from protocol.consumer_protocol import Subscription, TopicPartitions, decode_assignment, decode_subscription
from protocol.consumer_protocol import Assignment, encode_assignment, encode_subscription
from protocol.error_codes import Errors
from protocol.errors import ConnectionClosed, ProtocolError, RequestTimedOut

import coordinator.loadgen.assignors as assignors  # the sibling modules, not the package that re-exports Simulation
import coordinator.loadgen.wire as wire
from coordinator.loadgen.options import SimOptions
from coordinator.loadgen.stats import Failure, GroupRounds, Stats

log = logging.getLogger("coordinator.loadgen")

_RETRY_BACKOFF_S = 0.1
_MAX_BACKOFF_S = 2.0
TRANSIENT = (ConnectionClosed, RequestTimedOut, ProtocolError, OSError, asyncio.TimeoutError)


class Rejoin(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Rediscover(Exception):
    pass


class Fenced(Exception):
    """A static member replaced by another instance with its group.instance.id: a real client stops."""


class MemberHost(Protocol):
    """What a member needs of the simulation that runs it (simulation.py's Simulation)."""

    options: SimOptions
    stats: Stats
    rounds: dict[str, GroupRounds]
    partition_counts: dict[str, int]
    connect_slots: asyncio.Semaphore

    async def find_coordinator(self, group_id: str) -> tuple[str, int]: ...
    async def connect(self, host: str, port: int, timeout_ms: int) -> KafkaClient: ...
    def forget_coordinator(self, group_id: str, address: tuple[str, int] | None = None) -> None: ...


class SimMember:
    def __init__(self, sim: MemberHost, group_id: str, index: int, static: bool) -> None:
        self.sim = sim
        self.group_id = group_id
        self.key = f"{group_id}/{index}"
        self.instance_id = f"{group_id}-instance-{index}" if static else None
        self.member_id = ""
        self.generation = -1
        self.protocol_name = sim.options.assignor
        self.owned: TopicPartitions = ()
        self.leader_id = ""  # of the current generation
        self.joined_members = 0
        self.assignment = b""  # as SyncGroup returned it (consumer-protocol bytes)
        self.offsets: dict[tuple[str, int], int] = {}
        self.state = "starting"  # starting, joining, stable, failed (injected), stopped
        self.phase = "starting"  # what it waits for now (the summary counts the phases of unstable members)
        self.client: KafkaClient | None = None
        self.coordinator: tuple[str, int] | None = None  # the address FindCoordinator gave for this connection
        self.task: asyncio.Task[None] | None = None
        self.slow_join_ms = 0  # injected: the next (re)join waits this long first
        self.last_heartbeat_ms: int | None = None  # wall clock of the last request that extends the session
        self.beating = False  # a heartbeat of the current generation was answered (failures are injected then)
        self._backoff_s = _RETRY_BACKOFF_S
        self._halted = False

    # ------------------------------------------------------------------------------------------------ lifecycle

    def start(self, reason: str, probe: Failure | None = None) -> None:
        if self.task is not None and not self.task.done():
            raise RuntimeError(f"member {self.key} is already running")  # two loops would share one identity
        self._halted = False
        self.task = asyncio.get_running_loop().create_task(self.run(reason, probe), name=f"member {self.key}")

    async def run(self, reason: str | None, probe: Failure | None = None) -> None:
        """`reason`: why a (re)join is needed; None resumes heartbeating in the current generation."""
        # the flag, besides cancel(): Python 3.11's wait_for can swallow a cancellation that races a completion
        while not self._halted:
            try:
                await self._ensure_connection()
                if probe is not None:
                    reason = await self._probe(probe) or reason
                    probe = None
                if reason is not None or self.generation < 0:
                    await self._join_and_sync(reason or "rejoin")
                    reason = None
                reason = await self._stable()
            except Rejoin as rejoin:
                reason = rejoin.reason
            except Rediscover:
                await self.drop_connection()
                await self._back_off()
            except Fenced:
                self.state = "stopped"
                log.warning("event=member_fenced group=%s instance=%s", self.group_id, self.instance_id)
                return
            except TRANSIENT as exc:
                self.sim.stats.connection_errors += 1
                log.debug("event=member_reconnect group=%s member=%s coordinator=%s error=%r", self.group_id,
                          self.member_id, self.coordinator, exc)
                self.sim.forget_coordinator(self.group_id, self.coordinator)  # dead, or no longer the owner
                await self.drop_connection()
                await self._back_off()

    async def _ensure_connection(self) -> None:
        if self.client is not None and not self.client.is_closed:
            return
        self.phase = "find-coordinator"
        self.coordinator = host, port = await self.sim.find_coordinator(self.group_id)
        self.phase = "connect"
        async with self.sim.connect_slots:
            self.client = await self.sim.connect(host, port, self.sim.options.request_timeout_ms)

    async def drop_connection(self, abort: bool = False) -> None:
        client, self.client = self.client, None
        if client is None:
            return
        await (client.abort() if abort else client.close())  # abort: a crash, RST and no goodbye

    async def _back_off(self) -> None:
        self.phase = "back-off"
        await asyncio.sleep(self._backoff_s * (0.5 + random.random()))
        self._backoff_s = min(self._backoff_s * 2, _MAX_BACKOFF_S)

    def _request_ok(self) -> None:
        self._backoff_s = _RETRY_BACKOFF_S

    # ------------------------------------------------------------------------------------------------ joining

    async def _join_and_sync(self, reason: str) -> None:
        self.state = "joining"
        self.beating = False
        rounds = self.sim.rounds[self.group_id]
        rounds.joining(self.key, reason)
        if self.slow_join_ms:
            self.phase = "slow-join"
            delay, self.slow_join_ms = self.slow_join_ms, 0
            await self._heartbeat_while_waiting(delay)
        response = await self._join(reason)
        self.member_id, self.generation = response.member_id, response.generation_id
        self.leader_id = response.leader
        self.joined_members = len(response.members)  # the leader's view of the generation (followers: 0)
        self.protocol_name = response.protocol_name or self.protocol_name
        assignments: dict[str, bytes] = {}
        if response.leader == self.member_id:
            rounds.leader_joined(self.generation, len(response.members))
            assignments = self._assign(response.members)
        await self._sync(assignments)

    async def _heartbeat_while_waiting(self, delay_ms: int) -> None:
        """A slow rejoin, as Kafka's consumer does it: its heartbeat thread keeps the session alive (answers:
        REBALANCE_IN_PROGRESS) until the JoinGroup goes out; after that the coordinator waits for it."""
        assert self.client is not None
        deadline = time.monotonic() + delay_ms / 1000
        heartbeat = None
        if self.member_id and self.generation >= 0:
            heartbeat = wire.HeartbeatFrame(self.client, self.group_id, self.generation, self.member_id,
                                            self.instance_id)
        while (remaining := deadline - time.monotonic()) > 0:
            await asyncio.sleep(min(remaining, self.sim.options.heartbeat_ms / 1000))
            if heartbeat is not None and time.monotonic() < deadline:
                self.last_heartbeat_ms = int(time.time() * 1000)
                code = heartbeat.error_code(await heartbeat.send(self.client, self.sim.options.request_timeout_ms))
                self.sim.stats.record("Heartbeat", code)

    async def _join(self, reason: str) -> Any:  # Any: a kio JoinGroup response of the version sent
        options = self.sim.options
        while True:
            assert self.client is not None
            subscription = Subscription((options.topic,), owned_partitions=self.owned, generation_id=self.generation)
            body = wire.join_group(self.client, self.group_id, self.member_id, self.instance_id, options.session_ms,
                                   options.rebalance_ms, self.protocol_name, encode_subscription(subscription),
                                   reason)
            self.phase = "join"
            response = await self.client.request(body, timeout_ms=options.rebalance_ms + options.request_timeout_ms)
            code = int(response.error_code)
            self.sim.stats.record("JoinGroup", code)
            if code == Errors.NONE:
                self._request_ok()
                return response
            if code == Errors.MEMBER_ID_REQUIRED:
                self.member_id = response.member_id
            elif code == Errors.UNKNOWN_MEMBER_ID:
                self._reset(member_id=True)
            elif code == Errors.ILLEGAL_GENERATION:
                self._reset(member_id=False)
            elif code == Errors.FENCED_INSTANCE_ID:
                raise Fenced()
            else:
                self._on_coordinator_error(code)
                await self._back_off()

    def _assign(self, members: tuple) -> dict[str, bytes]:
        subscriptions: dict[str, Subscription] = {}
        for member in members:
            try:
                subscriptions[member.member_id] = decode_subscription(bytes(member.metadata))[1]
            except ValueError:  # another client's metadata we cannot read: it gets nothing
                subscriptions[member.member_id] = Subscription(())
        result = assignors.assign(self.protocol_name, subscriptions, self.sim.partition_counts)
        return {member: encode_assignment(assignment) for member, assignment in result.items()}

    async def _sync(self, assignments: dict[str, bytes]) -> None:
        options = self.sim.options
        assert self.client is not None
        body = wire.sync_group(self.client, self.group_id, self.generation, self.member_id, self.instance_id,
                               self.protocol_name, assignments)
        self.phase = "sync"
        response = await self.client.request(body, timeout_ms=options.rebalance_ms + options.request_timeout_ms)
        code = int(response.error_code)
        self.sim.stats.record("SyncGroup", code)
        if code != Errors.NONE:
            self._on_group_error(code, "SyncGroup")
        self.assignment = bytes(response.assignment)
        assignment = decode_assignment(self.assignment)[1] if response.assignment else Assignment(())
        gone = assignors.revoked(self.owned, assignment.partitions)
        self.owned = assignment.partitions
        self.offsets = {tp: off for tp, off in self.offsets.items() if _owns(self.owned, tp)}
        self.state = "stable"
        self._request_ok()
        done = self.sim.rounds[self.group_id].synced_generation(self.key, self.generation)
        if done is not None:
            self.sim.stats.rebalances.append(done)
        if gone and self.protocol_name == assignors.COOPERATIVE_STICKY:
            raise Rejoin("cooperative: partitions revoked")  # KIP-429: give them up, then rejoin at once

    # ------------------------------------------------------------------------------------------------ stable

    async def _stable(self) -> str | None:
        """Heartbeat (and commit) until an answer asks for a rejoin; returns its reason."""
        options = self.sim.options
        assert self.client is not None
        client = self.client
        self.state = self.phase = "stable"
        heartbeat = wire.HeartbeatFrame(client, self.group_id, self.generation, self.member_id, self.instance_id)
        interval_s = options.heartbeat_ms / 1000
        commit_due = time.monotonic() + options.commit_interval_ms / 1000 * random.random()
        await asyncio.sleep(interval_s * random.random())  # spread members over the interval
        while not self._halted:
            self.last_heartbeat_ms = int(time.time() * 1000)
            frame = await heartbeat.send(client, options.request_timeout_ms)
            code = heartbeat.error_code(frame)
            self.sim.stats.heartbeats += 1
            self.sim.stats.record("Heartbeat", code)
            if code == Errors.NONE:
                self.beating = True
            elif code != Errors.COORDINATOR_LOAD_IN_PROGRESS:
                self._on_group_error(code, "Heartbeat")
            if options.commit_interval_ms and time.monotonic() >= commit_due:
                commit_due = time.monotonic() + options.commit_interval_ms / 1000
                await self._commit()
            await asyncio.sleep(interval_s)
        return None

    async def _commit(self) -> None:
        if not self.owned or self.client is None:
            return
        for topic, partitions in self.owned:
            for partition in partitions:
                key = (topic, partition)
                self.offsets[key] = self.offsets.get(key, 0) + self.sim.options.records_per_commit
        body = wire.offset_commit(self.client, self.group_id, self.generation, self.member_id, self.instance_id,
                                  self.offsets)
        self.last_heartbeat_ms = int(time.time() * 1000)  # Kafka: a commit in Stable also extends the session
        response = await self.client.request(body)
        self.sim.stats.commits += 1
        codes = {int(p.error_code) for t in response.topics for p in t.partitions}
        for code in codes:
            self.sim.stats.record("OffsetCommit", code)
        for code in codes - {Errors.NONE, Errors.REQUEST_TIMED_OUT, Errors.COORDINATOR_LOAD_IN_PROGRESS}:
            self._on_group_error(code, "OffsetCommit")

    # ------------------------------------------------------------------------------------------------ errors

    def _on_group_error(self, code: int, api: str) -> None:
        if code == Errors.REBALANCE_IN_PROGRESS:
            raise Rejoin(f"{api}: REBALANCE_IN_PROGRESS")
        if code == Errors.ILLEGAL_GENERATION:
            self._reset(member_id=False)
            raise Rejoin(f"{api}: ILLEGAL_GENERATION")
        if code == Errors.UNKNOWN_MEMBER_ID:
            self._reset(member_id=True)
            raise Rejoin(f"{api}: UNKNOWN_MEMBER_ID")
        if code == Errors.FENCED_INSTANCE_ID:
            raise Fenced()
        self._on_coordinator_error(code)
        raise Rejoin(f"{api}: error {code}")

    def _on_coordinator_error(self, code: int) -> None:
        if code in (Errors.NOT_COORDINATOR, Errors.COORDINATOR_NOT_AVAILABLE):
            self.sim.forget_coordinator(self.group_id, self.coordinator)
            raise Rediscover()
        # COORDINATOR_LOAD_IN_PROGRESS and anything else: the caller backs off and retries

    def _reset(self, member_id: bool) -> None:
        """Kafka's consumer on ILLEGAL_GENERATION / UNKNOWN_MEMBER_ID: forget the generation (and the id) and
        the partitions it owned (they are lost: another member may own them now)."""
        self.generation = -1
        self.owned = ()
        if member_id:
            self.member_id = ""

    # ------------------------------------------------------------------------------------------------ failures

    async def _probe(self, failure: Failure) -> str | None:
        """Back from a crash or a hang: one heartbeat with the old identity tells whether the coordinator
        removed it (UNKNOWN_MEMBER_ID: detected). Returns the rejoin reason."""
        assert self.client is not None
        heartbeat = wire.HeartbeatFrame(self.client, self.group_id, failure.generation, failure.member_id,
                                        failure.instance_id)
        code = heartbeat.error_code(await heartbeat.send(self.client, self.sim.options.request_timeout_ms))
        failure.probe_code = code
        self.sim.stats.record("Heartbeat", code, expected=failure.expect_detection and code == Errors.UNKNOWN_MEMBER_ID)
        if code == Errors.UNKNOWN_MEMBER_ID:
            failure.detected += 1
            self._reset(member_id=True)
            return f"back after {failure.kind}: UNKNOWN_MEMBER_ID"
        if code == Errors.ILLEGAL_GENERATION:
            self._reset(member_id=False)
        return f"back after {failure.kind}"

    def failure_record(self, kind: str, expect_detection: bool) -> Failure:
        return Failure(kind, self.group_id, self.key, self.member_id, self.instance_id, self.generation, time.time(),
                       self.last_heartbeat_ms, expect_detection)

    async def halt(self, abort: bool) -> None:
        """Stop the member's task (its requests stop); with `abort` also drop the connection without a word."""
        self._halted = True
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
            self.task = None
        if abort:
            await self.drop_connection(abort=True)

    async def leave(self) -> None:
        """LeaveGroup, as a closing consumer sends it (dynamic members; a static member's close does not)."""
        if self.client is None or self.client.is_closed or not self.member_id:
            return
        try:
            response = await self.client.request(wire.leave_group(self.client, self.group_id, self.member_id,
                                                                  self.instance_id), timeout_ms=5_000)
            for code in wire.leave_errors(response):
                self.sim.stats.record("LeaveGroup", code)
        except TRANSIENT:
            pass
        self._reset(member_id=True)


def _owns(owned: TopicPartitions, tp: tuple[str, int]) -> bool:
    return any(topic == tp[0] and tp[1] in ids for topic, ids in owned)

