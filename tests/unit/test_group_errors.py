"""Error codes per group state × request × member situation, as Kafka 3.9 answers them (reference §3.1–§3.5).

Every row runs on a fresh coordinator. The group has a dynamic leader A and a static follower S (instance "is").
Situations: the member A itself; A with a wrong generation; an unknown member id; an unknown member id that
claims S's instance id (fenced); A claiming an instance id nobody has.
"""
from __future__ import annotations

import asyncio

import pytest

from coordinator.group.status import ShardStatus
from coordinator.group.api import (LeaveGroupRequest, MemberIdentity, OffsetCommitRequest,
                                   OffsetCommitRequestPartition, OffsetCommitRequestTopic, SyncGroupRequest,
                                   SyncGroupRequestAssignment, HeartbeatRequest)
from protocol.error_codes import Errors
from coordinator.group.state import GroupState
from tests.support.group_harness import Client, Env, advance_until_joined, complete_rebalance, drain

E = Errors
PARKED = "parked"
SITUATIONS = ["member", "stale_generation", "unknown_member", "fenced", "unknown_instance"]
STATES = ["Stable", "CompletingRebalance", "PreparingRebalance", "Empty", "Dead", "UnknownGroup"]

# expected[request][state] = codes for SITUATIONS, in order
EXPECTED: dict[str, dict[str, list]] = {
    "heartbeat": {
        "Stable": [E.NONE, E.ILLEGAL_GENERATION, E.UNKNOWN_MEMBER_ID, E.FENCED_INSTANCE_ID, E.UNKNOWN_MEMBER_ID],
        "CompletingRebalance": [E.NONE, E.ILLEGAL_GENERATION, E.UNKNOWN_MEMBER_ID, E.FENCED_INSTANCE_ID,
                                E.UNKNOWN_MEMBER_ID],
        "PreparingRebalance": [E.REBALANCE_IN_PROGRESS, E.ILLEGAL_GENERATION, E.UNKNOWN_MEMBER_ID,
                               E.FENCED_INSTANCE_ID, E.UNKNOWN_MEMBER_ID],
        "Empty": [E.UNKNOWN_MEMBER_ID] * 5,
        "Dead": [E.COORDINATOR_NOT_AVAILABLE] * 5,
        "UnknownGroup": [E.UNKNOWN_MEMBER_ID] * 5,
    },
    "sync": {
        "Stable": [E.NONE, E.ILLEGAL_GENERATION, E.UNKNOWN_MEMBER_ID, E.FENCED_INSTANCE_ID, E.UNKNOWN_MEMBER_ID],
        "CompletingRebalance": [E.NONE, E.ILLEGAL_GENERATION, E.UNKNOWN_MEMBER_ID, E.FENCED_INSTANCE_ID,
                                E.UNKNOWN_MEMBER_ID],
        "PreparingRebalance": [E.REBALANCE_IN_PROGRESS, E.ILLEGAL_GENERATION, E.UNKNOWN_MEMBER_ID,
                               E.FENCED_INSTANCE_ID, E.UNKNOWN_MEMBER_ID],
        "Empty": [E.UNKNOWN_MEMBER_ID] * 5,
        "Dead": [E.COORDINATOR_NOT_AVAILABLE] * 5,
        "UnknownGroup": [E.UNKNOWN_MEMBER_ID] * 5,
    },
    "commit": {
        "Stable": [E.NONE, E.ILLEGAL_GENERATION, E.UNKNOWN_MEMBER_ID, E.FENCED_INSTANCE_ID, E.UNKNOWN_MEMBER_ID],
        "CompletingRebalance": [E.REBALANCE_IN_PROGRESS, E.ILLEGAL_GENERATION, E.UNKNOWN_MEMBER_ID,
                                E.FENCED_INSTANCE_ID, E.UNKNOWN_MEMBER_ID],
        "PreparingRebalance": [E.NONE, E.ILLEGAL_GENERATION, E.UNKNOWN_MEMBER_ID, E.FENCED_INSTANCE_ID,
                               E.UNKNOWN_MEMBER_ID],
        "Empty": [E.UNKNOWN_MEMBER_ID] * 5,
        "Dead": [E.COORDINATOR_NOT_AVAILABLE] * 5,
        "UnknownGroup": [E.ILLEGAL_GENERATION] * 5,
    },
    "leave": {  # LeaveGroup carries no generation: the stale row is a plain leave
        "Stable": [E.NONE, E.NONE, E.UNKNOWN_MEMBER_ID, E.FENCED_INSTANCE_ID, E.UNKNOWN_MEMBER_ID],
        "CompletingRebalance": [E.NONE, E.NONE, E.UNKNOWN_MEMBER_ID, E.FENCED_INSTANCE_ID, E.UNKNOWN_MEMBER_ID],
        "PreparingRebalance": [E.NONE, E.NONE, E.UNKNOWN_MEMBER_ID, E.FENCED_INSTANCE_ID, E.UNKNOWN_MEMBER_ID],
        "Empty": [E.UNKNOWN_MEMBER_ID] * 5,
        "Dead": [E.COORDINATOR_NOT_AVAILABLE] * 5,  # top-level error
        "UnknownGroup": [E.UNKNOWN_MEMBER_ID] * 5,
    },
    "join": {  # JoinGroup with a known member id and unchanged metadata; no generation either
        "Stable": [PARKED, PARKED, E.UNKNOWN_MEMBER_ID, E.FENCED_INSTANCE_ID, E.UNKNOWN_MEMBER_ID],  # A leads
        "CompletingRebalance": [E.NONE, E.NONE, E.UNKNOWN_MEMBER_ID, E.FENCED_INSTANCE_ID, E.UNKNOWN_MEMBER_ID],
        "PreparingRebalance": [PARKED, PARKED, E.UNKNOWN_MEMBER_ID, E.FENCED_INSTANCE_ID, E.UNKNOWN_MEMBER_ID],
        "Empty": [E.UNKNOWN_MEMBER_ID] * 5,
        "Dead": [E.COORDINATOR_NOT_AVAILABLE] * 5,
        "UnknownGroup": [E.UNKNOWN_MEMBER_ID] * 5,
    },
}


async def build(env: Env, state: str) -> tuple[Client, Client]:
    a, s = env.client("a"), env.client("s", instance_id="is")
    if state == "UnknownGroup":
        a.member_id, a.generation = "a-1", 1
        return a, s
    await a.start_join()  # A joins first, so A is the leader
    await s.start_join()
    await advance_until_joined(env, a, s)
    if state == "CompletingRebalance":
        a.take_join(), s.take_join()
    else:
        await complete_rebalance(env, a, s)
    if state == "PreparingRebalance":
        await env.client("c").start_join()
    elif state == "Empty":
        await a.leave(), await s.leave()
        await drain()
    elif state == "Dead":
        env.group().transition_to(GroupState.DEAD, env.clock.now_ms())
    assert env.state() is (None if state == "UnknownGroup" else GroupState(state))
    return a, s


def identity(a: Client, situation: str) -> tuple[str, str | None, int]:
    return {
        "member": (a.member_id, None, a.generation),
        "stale_generation": (a.member_id, None, a.generation + 1),
        "unknown_member": ("nobody", None, a.generation),
        "fenced": ("nobody", "is", a.generation),
        "unknown_instance": (a.member_id, "nope", a.generation),
    }[situation]


async def send(env: Env, request: str, a: Client, member_id: str, instance_id: str | None, generation: int):
    coord = env.coordinator
    if request == "heartbeat":
        return (await coord.heartbeat(HeartbeatRequest("g", generation, member_id, instance_id))).error_code
    if request == "sync":
        req = SyncGroupRequest("g", generation, member_id, instance_id,
                               assignments=[SyncGroupRequestAssignment(member_id, b"x")])
        task = asyncio.ensure_future(coord.sync_group(req))
        await drain()
        return task.result().error_code if task.done() else PARKED
    if request == "commit":
        req = OffsetCommitRequest("g", generation, member_id,
                                  [OffsetCommitRequestTopic("t", [OffsetCommitRequestPartition(0, 1)])],
                                  group_instance_id=instance_id)
        return (await coord.commit_offsets(req)).topics[0].partitions[0].error_code
    if request == "leave":
        resp = await coord.leave_group(LeaveGroupRequest("g", [MemberIdentity(member_id, instance_id)]))
        return resp.members[0].error_code if resp.members else resp.error_code
    if request == "join":
        task = asyncio.ensure_future(coord.join_group(a.join_request(member_id=member_id, group_instance_id=instance_id)))
        await drain()
        return task.result().error_code if task.done() else PARKED
    raise AssertionError(request)


CASES = [(request, state, i) for request in EXPECTED for state in STATES for i in range(len(SITUATIONS))]


@pytest.mark.parametrize("request_kind,state,index", CASES,
                         ids=[f"{r}-{s}-{SITUATIONS[i]}" for r, s, i in CASES])
async def test_error_code(request_kind: str, state: str, index: int) -> None:
    env = Env()
    try:
        a, _ = await build(env, state)
        member_id, instance_id, generation = identity(a, SITUATIONS[index])
        got = await send(env, request_kind, a, member_id, instance_id, generation)
        assert got == EXPECTED[request_kind][state][index]
    finally:
        await env.close()


@pytest.mark.parametrize("request_kind", ["heartbeat", "sync", "commit", "leave", "join"])
async def test_status_errors_come_first(request_kind: str) -> None:
    """Inactive coordinator: COORDINATOR_NOT_AVAILABLE; loading: LOAD_IN_PROGRESS with Kafka's substitutions."""
    env = Env()
    try:
        a, _ = await build(env, "Stable")
        env.coordinator.begin_loading()
        loading = {"heartbeat": E.NONE, "sync": E.REBALANCE_IN_PROGRESS}.get(request_kind,
                                                                           E.COORDINATOR_LOAD_IN_PROGRESS)
        assert await send(env, request_kind, a, a.member_id, None, a.generation) == loading
        env.set_status(ShardStatus.UNOWNED)
        assert await send(env, request_kind, a, a.member_id, None, a.generation) == E.NOT_COORDINATOR
        env.set_status(ShardStatus.STOPPED)
        assert await send(env, request_kind, a, a.member_id, None, a.generation) == E.COORDINATOR_NOT_AVAILABLE
    finally:
        env.set_status(ShardStatus.ACTIVE)
        await env.close()
