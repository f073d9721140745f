"""What observers are told, as data: the cause of a rebalance (category, member, client reason), the event of
each kind of offset removal, and every append to the state topic (from a request or from a timer)."""
from __future__ import annotations

from coordinator.group.api import DeleteGroupsRequest, OffsetDeleteRequest, OffsetDeleteRequestTopic
from protocol.error_codes import Errors
from coordinator.group.observer import RebalanceCategory, RebalanceCause
from coordinator.group.records import GroupMetadataRecord, OffsetCommitRecord
from tests.support.group_harness import REBALANCE_MS, SESSION_MS, Env, commit, env, form_group  # noqa: F401


def causes(env: Env) -> list[RebalanceCause]:
    return [event[3] for event in env.observer.of("rebalance_started")]


async def test_the_cause_is_data_not_text(env: Env) -> None:
    # A client id and a client reason that name other categories change nothing: the category is the shard's.
    leader = env.client("leader-of-the-pack")
    await form_group(env, leader)
    joining = env.client("leader-too")
    await joining.start_join(reason="leader rebalance after heartbeat expiration")
    cause = causes(env)[-1]
    assert cause.category is RebalanceCategory.MEMBER_JOINED
    assert cause.member_id == joining.member_id
    assert cause.client_reason == "leader rebalance after heartbeat expiration"
    assert cause.text == (f"Adding new member {joining.member_id} with group instance id None; "
                          "client reason: leader rebalance after heartbeat expiration")


async def test_a_leave_and_a_session_expiry_say_who(env: Env) -> None:
    a, b = env.client("a"), env.client("b")
    await form_group(env, a, b)
    await b.leave()
    assert causes(env)[-1] == RebalanceCause(
        RebalanceCategory.MEMBER_LEFT, f"Removing member {b.member_id} on LeaveGroup; client reason: not provided",
        b.member_id, "not provided")


async def test_a_session_expiry_says_whose(env: Env) -> None:
    a, b = env.client("a"), env.client("b")
    await form_group(env, a, b)
    for _ in range(SESSION_MS // 1_000 + 2):  # only a heartbeats
        await env.advance(1_000)
        await a.heartbeat()
    assert causes(env)[-1] == RebalanceCause(
        RebalanceCategory.SESSION_TIMEOUT, f"removing member {b.member_id} on heartbeat expiration", b.member_id)


async def test_offset_delete_and_delete_groups_are_not_expiries(env: Env) -> None:
    for group_id in ("deleted-offsets", "deleted-group"):
        await env.coordinator.commit_offsets(commit(group_id, -1, "", {("t", 0): 1, ("t", 1): 2}))
    response = await env.coordinator.delete_offsets(
        OffsetDeleteRequest("deleted-offsets", [OffsetDeleteRequestTopic("t", [0])]))
    assert response.error_code == Errors.NONE
    deleted = await env.coordinator.delete_groups(DeleteGroupsRequest(["deleted-group"]))
    assert [r.error_code for r in deleted.results] == [Errors.NONE]
    assert env.observer.of("offsets_deleted") == [("offsets_deleted", "deleted-offsets", 1)]
    assert env.observer.of("group_deleted") == [("group_deleted", "deleted-group", 2)]
    assert env.observer.of("offsets_expired") == []


async def test_every_append_is_reported_timer_writes_included(env: Env) -> None:
    a = env.client("a")
    await form_group(env, a)
    await env.coordinator.commit_offsets(commit("g", a.generation, a.member_id, {("t", 0): 5}))
    by_request = [(e[3], e[5], e[6]) for e in env.observer.of("append_completed")]
    assert [type(records[0]) for records, _, _ in by_request] == [GroupMetadataRecord, OffsetCommitRecord]
    assert all(error == "NONE" and requested for _, error, requested in by_request)
    # The member's session runs out: the group empties on a timer, and its record is appended as any other.
    await env.advance(REBALANCE_MS * 2)
    emptied = env.observer.of("append_completed")[-1]
    assert emptied[1] == "g" and emptied[6] is False
    assert emptied[3] == [GroupMetadataRecord("g", emptied[3][0].value)] and emptied[3][0].value.members == []
