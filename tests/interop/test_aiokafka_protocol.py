"""Interop with an independent implementation of the Kafka protocol: aiokafka's own request/response classes
and its connection code (AIOKafkaClient over aiokafka.conn) drive three members through a full rebalance
against our server and the real GroupRuntime (in-memory store, real timer). No Kafka broker is needed."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest
from aiokafka.client import AIOKafkaClient, ConnectionGroup
from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment, ConsumerProtocolMemberMetadata
from aiokafka.protocol.admin import DescribeGroupsRequest, ListGroupsRequest
from aiokafka.protocol.commit import OffsetCommitRequest, OffsetFetchRequest
from aiokafka.protocol.coordination import FindCoordinatorRequest
from aiokafka.protocol.group import HeartbeatRequest, JoinGroupRequest, LeaveGroupRequest, SyncGroupRequest

from coordinator.config import CoordinatorConfig
from protocol.consumer_protocol import decode_assignment, decode_subscription
from tests.support.server import RunningServer

pytestmark = pytest.mark.interop

GROUP = "interop-group"
SESSION_MS = 1_500
REBALANCE_MS = 8_000
NONE, ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID, REBALANCE_IN_PROGRESS, MEMBER_ID_REQUIRED = 0, 22, 25, 27, 79
CONFIG = CoordinatorConfig(group_initial_rebalance_delay_ms=300, group_min_session_timeout_ms=500)


@dataclass
class Member:
    name: str
    client: AIOKafkaClient
    node_id: int
    member_id: str = ""
    generation_id: int = -1
    assignment: list[tuple[str, list[int]]] | None = None

    async def send(self, request):
        return await self.client.send(self.node_id, request, group=ConnectionGroup.COORDINATION)

    async def join(self):
        metadata = ConsumerProtocolMemberMetadata(0, ["orders"], b"").encode()
        request = JoinGroupRequest(GROUP, SESSION_MS, REBALANCE_MS, self.member_id, None, "consumer",
                                   [("range", metadata)])
        response = await self.send(request)
        if response.error_code == MEMBER_ID_REQUIRED:  # KIP-394: join again with the id we were given
            self.member_id = response.member_id
            response = await self.send(JoinGroupRequest(GROUP, SESSION_MS, REBALANCE_MS, self.member_id, None,
                                                        "consumer", [("range", metadata)]))
        assert response.error_code == NONE, response
        self.member_id, self.generation_id = response.member_id, response.generation_id
        return response

    async def sync(self, assignments: list[tuple[str, bytes]]) -> None:
        response = await self.send(SyncGroupRequest(GROUP, self.generation_id, self.member_id, None, assignments))
        assert response.error_code == NONE, response
        decoded = ConsumerProtocolMemberAssignment.decode(response.member_assignment)
        self.assignment = [(topic, list(partitions)) for topic, partitions in decoded.assignment]
        # our own codec reads the same bytes the same way
        _version, ours = decode_assignment(response.member_assignment)
        assert [(t, list(p)) for t, p in ours.partitions] == self.assignment

    async def heartbeat(self) -> int:
        response = await self.send(HeartbeatRequest(GROUP, self.generation_id, self.member_id))
        return response.error_code


def range_assignment(join_response) -> list[tuple[str, bytes]]:
    """The leader's job: six partitions of "orders" split over the members, by aiokafka's own structs."""
    members = sorted(m[0] for m in join_response.members)
    for member in join_response.members:
        version, subscription = decode_subscription(member[-1])
        assert subscription.topics == ("orders",)
    per_member = {m: [p for p in range(6) if p % len(members) == i] for i, m in enumerate(members)}
    return [(m, ConsumerProtocolMemberAssignment(0, [("orders", per_member[m])], b"").encode()) for m in members]


async def rebalance(members: list[Member]) -> int:
    joined = await asyncio.gather(*(m.join() for m in members))
    generations = {r.generation_id for r in joined}
    assert len(generations) == 1
    (leader,) = [(m, r) for m, r in zip(members, joined) if r.leader_id == r.member_id]
    assert len(leader[1].members) == len(members)
    assignments = range_assignment(leader[1])
    await asyncio.gather(*(m.sync(assignments if m is leader[0] else []) for m in members))
    return generations.pop()


async def test_three_aiokafka_members_through_a_full_rebalance() -> None:
    async with RunningServer(CONFIG) as env:
        members = []
        for name in ("a", "b", "c"):
            client = AIOKafkaClient(bootstrap_servers=f"127.0.0.1:{env.port}", client_id=f"interop-{name}")
            await client.bootstrap()
            found = await client.send(0, FindCoordinatorRequest(GROUP, 0))
            assert (found.error_code, found.coordinator_id, found.host, found.port) == (
                NONE, 0, "127.0.0.1", env.port)
            members.append(Member(name, client, found.coordinator_id))
        try:
            await _scenario(env, members)
        finally:
            for member in members:
                await member.client.close()


async def _scenario(env: RunningServer, members: list[Member]) -> None:
    a, b, c = members
    generation = await rebalance(members)
    assert generation == 1
    assert sorted(p for m in members for _t, parts in m.assignment for p in parts) == list(range(6))
    assert [await m.heartbeat() for m in members] == [NONE, NONE, NONE]

    # c stops heartbeating: once its session expires the others are told to rejoin
    errors = await _heartbeat_until_rebalance([a, b])
    assert errors == {REBALANCE_IN_PROGRESS}
    generation = await rebalance([a, b])
    assert generation == 2
    assert await c.heartbeat() == UNKNOWN_MEMBER_ID
    assert sorted(p for m in (a, b) for _t, parts in m.assignment for p in parts) == list(range(6))

    committed = await a.send(OffsetCommitRequest(GROUP, a.generation_id, a.member_id, -1,
                                                 [("orders", [(p, 100 + p, "by-a") for p in range(6)])]))
    assert [e for _t, parts in committed.topics for _p, e in parts] == [NONE] * 6
    stale = await b.send(OffsetCommitRequest(GROUP, 1, b.member_id, -1, [("orders", [(0, 1, "")])]))
    assert stale.topics[0][1][0][1] == ILLEGAL_GENERATION
    fetched = await b.send(OffsetFetchRequest(GROUP, [("orders", [0, 5, 6])]))
    assert [(p, o, meta, e) for _t, parts in fetched.topics for p, o, meta, e in parts] == [
        (0, 100, "by-a", NONE), (5, 105, "by-a", NONE), (6, -1, "", NONE)]

    left = await b.send(LeaveGroupRequest(GROUP, b.member_id))
    assert left.error_code == NONE
    assert await _heartbeat_until_rebalance([a]) == {REBALANCE_IN_PROGRESS}
    assert await rebalance([a]) == 3

    described = await a.send(DescribeGroupsRequest([GROUP]))
    (group,) = described.groups
    error_code, group_id, state, protocol_type, protocol, group_members = group[:6]
    assert (error_code, group_id, state, protocol_type, protocol) == (NONE, GROUP, "Stable", "consumer", "range")
    assert [(m[0], m[1], m[2]) for m in group_members] == [(a.member_id, "interop-a", "/127.0.0.1")]
    listed = await a.send(ListGroupsRequest())
    assert listed.error_code == NONE and [(g[0], g[1]) for g in listed.groups] == [(GROUP, "consumer")]


async def _heartbeat_until_rebalance(members: list[Member], interval_s: float = 0.2) -> set[int]:
    """Heartbeat like a consumer (NONE keeps us going) until the coordinator asks for a rejoin."""
    deadline = asyncio.get_running_loop().time() + SESSION_MS / 1000 * 4
    while asyncio.get_running_loop().time() < deadline:
        errors = {await m.heartbeat() for m in members}
        if errors != {NONE}:
            return errors
        await asyncio.sleep(interval_s)
    raise AssertionError("no rebalance was signalled")
