"""Test harness for the group coordinator: manual clock, synchronous timer executor, in-memory store, small
clients that speak the classic protocol through the coordinator's typed API, and offset commit/fetch requests."""
from __future__ import annotations

import asyncio
import dataclasses
import struct

import pytest

from coordinator.config import CoordinatorConfig
from coordinator.group.api import (HeartbeatRequest, JoinGroupProtocol, JoinGroupRequest, JoinGroupResponse,
                                   LeaveGroupRequest, MemberIdentity, OffsetCommitRequest, OffsetCommitRequestPartition,
                                   OffsetCommitRequestTopic, OffsetFetchRequest, OffsetFetchRequestTopic,
                                   SyncGroupRequest, SyncGroupRequestAssignment, SyncGroupResponse)
from coordinator.group.runtime import GroupRuntime
from protocol.error_codes import Errors
from coordinator.group.observer import GroupObserver
from coordinator.group.status import ShardStatus
from coordinator.group.state import GroupState
from coordinator.group.store import GroupStore, InMemoryGroupStore
from coordinator.group.records import GroupRecord, OffsetRecord, TopicPartition
from coordinator.timer import ManualClock, SystemTimer

SESSION_MS = 10_000
REBALANCE_MS = 30_000


def subscription(*topics: str) -> bytes:
    """ConsumerProtocolSubscription v0: version, topics, user data."""
    out = struct.pack(">hi", 0, len(topics))
    for t in topics:
        out += struct.pack(">h", len(t)) + t.encode()
    return out + struct.pack(">i", -1)


class RecordingObserver(GroupObserver):
    def __init__(self) -> None:
        self.events: list[tuple] = []

    def on_state_change(self, *args):
        self.events.append(("state", *args))

    def on_member_joined(self, *args):
        self.events.append(("joined", *args))

    def on_member_replaced(self, *args):
        self.events.append(("replaced", *args))

    def on_member_left(self, *args):
        self.events.append(("left", *args))

    def on_member_failed(self, *args):
        self.events.append(("failed", *args))

    def on_rebalance_started(self, *args):
        self.events.append(("rebalance_started", *args))

    def on_rebalance_completed(self, *args):
        self.events.append(("rebalance_completed", *args))

    def on_offsets_expired(self, *args):
        self.events.append(("offsets_expired", *args))

    def on_offsets_deleted(self, *args):
        self.events.append(("offsets_deleted", *args))

    def on_group_deleted(self, *args):
        self.events.append(("group_deleted", *args))

    def on_append_completed(self, *args):
        self.events.append(("append_completed", *args))

    def of(self, kind: str) -> list[tuple]:
        return [e for e in self.events if e[0] == kind]


class Env:
    def __init__(self, *, store: GroupStore | None = None, **config: int) -> None:
        """`store`: the in-memory store by default; a test of the Kafka store's path passes a started one."""
        defaults = dict(group_initial_rebalance_delay_ms=3_000)
        defaults.update(config)
        self.config = CoordinatorConfig(**defaults)
        self.clock = ManualClock(1_000_000)
        self.timer = SystemTimer("test", clock=self.clock, executor=lambda fn: fn())
        self.store: GroupStore = store if store is not None else InMemoryGroupStore()
        self.observer = RecordingObserver()
        self.coordinator = GroupRuntime(self.config, self.timer, self.store, self.clock, self.observer)

    async def advance(self, ms: int, step_ms: int = 500) -> None:
        """Moves time in steps, firing the timer and letting parked requests run after each step."""
        while ms > 0:
            delta = min(step_ms, ms)
            self.clock.advance(delta)
            ms -= delta
            self.timer.advance_clock()
            await drain()

    def set_status(self, status: ShardStatus, group_id: str | None = None) -> None:
        """Puts the shard of `group_id` (every shard if None) in `status`, as ownership or shutdown would."""
        shards = self.coordinator.shards if group_id is None else [self.coordinator.shard_for(group_id)]
        for shard in shards:
            shard.status = status

    async def load(self, groups: dict[str, GroupRecord | None],
                   offsets: dict[str, dict[TopicPartition, OffsetRecord]] | None = None) -> None:
        """Puts records in the store (None: a tombstone) and loads every partition from it."""
        for group_id, record in groups.items():
            if record is None:
                self.store.groups.pop(group_id, None)
            else:
                self.store.groups[group_id] = record
        for group_id, by_partition in (offsets or {}).items():
            self.store.offsets.setdefault(group_id, {}).update(by_partition)
        await self.coordinator.load()

    def group(self, group_id: str = "g"):
        return self.coordinator.groups.get(group_id)

    def state(self, group_id: str = "g") -> GroupState | None:
        group = self.group(group_id)
        return None if group is None else group.state

    def client(self, name: str = "c", group_id: str = "g", **kw) -> Client:
        return Client(self, name, group_id, **kw)

    async def close(self) -> None:
        await self.coordinator.shutdown()
        await self.timer.close()


async def drain(rounds: int = 10) -> None:
    for _ in range(rounds):
        await asyncio.sleep(0)


class Client:
    """One consumer: member id, generation and the last responses."""

    def __init__(self, env: Env, name: str, group_id: str, instance_id: str | None = None, version: int = 9,
                 topics: tuple[str, ...] = ("t",), protocols: list[tuple[str, bytes]] | None = None,
                 session_timeout_ms: int = SESSION_MS, rebalance_timeout_ms: int = REBALANCE_MS) -> None:
        self.env, self.name, self.group_id = env, name, group_id
        self.instance_id, self.version = instance_id, version
        self.protocols = protocols or [("range", subscription(*topics))]
        self.session_timeout_ms, self.rebalance_timeout_ms = session_timeout_ms, rebalance_timeout_ms
        self.member_id = ""
        self.generation = -1
        self.leader = ""
        self.join_task: asyncio.Task[JoinGroupResponse] | None = None
        self.sync_task: asyncio.Task[SyncGroupResponse] | None = None

    @property
    def coordinator(self) -> GroupRuntime:
        return self.env.coordinator

    def join_request(self, **overrides) -> JoinGroupRequest:
        req = JoinGroupRequest(
            group_id=self.group_id, session_timeout_ms=self.session_timeout_ms,
            rebalance_timeout_ms=self.rebalance_timeout_ms, member_id=self.member_id,
            group_instance_id=self.instance_id, protocol_type="consumer",
            protocols=[JoinGroupProtocol(n, m) for n, m in self.protocols], version=self.version,
            client_id=self.name, client_host="/127.0.0.1")
        return dataclasses.replace(req, **overrides)

    async def start_join(self, **overrides) -> asyncio.Task[JoinGroupResponse]:
        """Sends JoinGroup (doing the MEMBER_ID_REQUIRED round trip) and returns the parked request."""
        task = asyncio.ensure_future(self.coordinator.join_group(self.join_request(**overrides)))
        await drain()
        if task.done() and task.result().error_code == Errors.MEMBER_ID_REQUIRED:
            self.member_id = task.result().member_id
            task = asyncio.ensure_future(self.coordinator.join_group(self.join_request(**overrides)))
            await drain()
        self.join_task = task
        return task

    def take_join(self) -> JoinGroupResponse:
        assert self.join_task is not None and self.join_task.done(), f"{self.name}: join still parked"
        resp = self.join_task.result()
        self.join_task = None
        if resp.error_code == Errors.NONE:
            self.member_id, self.generation, self.leader = resp.member_id, resp.generation_id, resp.leader
        return resp

    @property
    def is_leader(self) -> bool:
        return self.leader == self.member_id

    async def start_sync(self, assignments: dict[str, bytes] | None = None) -> asyncio.Task[SyncGroupResponse]:
        req = SyncGroupRequest(self.group_id, self.generation, self.member_id, self.instance_id, "consumer",
                               None, [SyncGroupRequestAssignment(m, a) for m, a in (assignments or {}).items()])
        self.sync_task = asyncio.ensure_future(self.coordinator.sync_group(req))
        await drain()
        return self.sync_task

    async def heartbeat(self) -> Errors:
        resp = await self.coordinator.heartbeat(
            HeartbeatRequest(self.group_id, self.generation, self.member_id, self.instance_id))
        return resp.error_code

    async def leave(self) -> Errors:
        resp = await self.coordinator.leave_group(
            LeaveGroupRequest(self.group_id, [MemberIdentity(self.member_id, self.instance_id)]))
        return resp.members[0].error_code if resp.members else resp.error_code


async def form_group(env: Env, *clients: Client, written_within_s: float | None = None) -> None:
    """All clients join, the initial delay passes, the leader assigns, everyone syncs: Stable. With a store that
    acknowledges in its own time (Kafka's), `written_within_s` bounds the wait for the assignment's write."""
    for c in clients:
        await c.start_join()
    await advance_until_joined(env, *clients)
    await complete_rebalance(env, *clients, written_within_s=written_within_s)


async def advance_until_joined(env: Env, *clients: Client, limit_ms: int = REBALANCE_MS + 10_000) -> int:
    """Advances time until every client's JoinGroup is answered; returns the time it took."""
    waited = 0
    while not all(c.join_task is not None and c.join_task.done() for c in clients):
        assert waited < limit_ms, "join phase did not complete"
        await env.advance(100, step_ms=100)
        waited += 100
    return waited


async def complete_rebalance(env: Env, *clients: Client, written_within_s: float | None = None) -> None:
    responses = [c.take_join() for c in clients]
    assert all(r.error_code == Errors.NONE for r in responses), responses
    leader = next(c for c in clients if c.is_leader)
    assignment = {c.member_id: f"assignment-{c.name}".encode() for c in clients}
    await leader.start_sync(assignment)
    for c in clients:
        if c is not leader:
            await c.start_sync()
    await drain()
    if written_within_s is not None:
        await asyncio.wait_for(asyncio.gather(*(c.sync_task for c in clients if c.sync_task)), written_within_s)
    for c in clients:
        assert c.sync_task is not None and c.sync_task.done(), c.name
        assert c.sync_task.result().error_code == Errors.NONE, c.sync_task.result()


@pytest.fixture
async def env():
    e = Env()
    yield e
    await e.close()


def commit(group_id: str, generation: int, member_id: str, offsets: dict[tuple[str, int], int],
           metadata: str | None = None, retention_time_ms: int = -1) -> OffsetCommitRequest:
    topics: dict[str, list[OffsetCommitRequestPartition]] = {}
    for (topic, partition), offset in offsets.items():
        topics.setdefault(topic, []).append(OffsetCommitRequestPartition(partition, offset,
                                                                         committed_metadata=metadata))
    return OffsetCommitRequest(group_id, generation, member_id,
                               [OffsetCommitRequestTopic(t, ps) for t, ps in topics.items()],
                               retention_time_ms=retention_time_ms)


def errors_of(resp) -> list[Errors]:
    return [p.error_code for t in resp.topics for p in t.partitions]


async def fetch(env: Env, group_id: str, wanted: dict[str, list[int]] | None, require_stable: bool = False):
    topics = None if wanted is None else [OffsetFetchRequestTopic(t, ps) for t, ps in wanted.items()]
    resp = await env.coordinator.fetch_offsets(OffsetFetchRequest(group_id, topics, require_stable))
    return {(t.name, p.partition_index): (p.committed_offset, p.metadata, p.error_code)
            for t in resp.topics for p in t.partitions}
