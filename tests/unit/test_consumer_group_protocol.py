"""The KIP-848 consumer group protocol through the runtime, on a manual clock: joins, epochs, revoke-before-assign
reconciliation, leave, session expiry, Kafka 4.1's validation errors, and the records each step produces."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import uuid

import pytest

from coordinator.config import CoordinatorConfig
from coordinator.group.modern.heartbeat import HeartbeatRequest
from coordinator.group.modern.member import MemberState
from coordinator.group.modern.records import (CurrentAssignmentRecord, GroupEpochRecord, MemberMetadataRecord,
                                              RecordType, TargetAssignmentEpochRecord, TargetAssignmentRecord,
                                              Tombstone)
from coordinator.group.runtime import GroupRuntime
from coordinator.topics import TopicImage
from protocol.error_codes import Errors
from tests.support.consumer_group_env import BAR, FOO, GROUP, SESSION_MS, Env


@pytest.fixture
async def env():  # type: ignore[no-untyped-def]
    environment = Env()
    yield environment
    await environment.close()


async def test_first_member_gets_every_partition_at_epoch_1(env: Env) -> None:
    response = await env.heartbeat("a", 0)
    assert (response.error, response.member_id, response.member_epoch) == (Errors.NONE, "a", 1)
    assert response.assignment == {FOO: (0, 1, 2, 3, 4, 5)}
    assert response.heartbeat_interval_ms == 5_000
    # Kafka's order for a first join (GroupMetadataManagerTest.testMemberJoinsEmptyConsumerGroup): 5, 3, 7, 6, 8
    assert [type(r) for r in env.records] == [MemberMetadataRecord, GroupEpochRecord, TargetAssignmentRecord,
                                             TargetAssignmentEpochRecord, CurrentAssignmentRecord]
    assert env.records[4] == CurrentAssignmentRecord(GROUP, "a", 1, 0, 0, {FOO: (0, 1, 2, 3, 4, 5)}, {})
    assert env.group().state.value == "Stable"
    # a plain heartbeat at the same epoch changes nothing and sends no assignment
    env.clear_records()
    again = await env.heartbeat("a", 1)
    assert (again.error, again.member_epoch, again.assignment, env.records) == (Errors.NONE, 1, None, [])


async def test_second_member_waits_until_the_first_revokes(env: Env) -> None:
    await env.heartbeat("a", 0)
    b = await env.heartbeat("b", 0)
    # b is at epoch 2 but its partitions are still a's: nothing yet (UNRELEASED_PARTITIONS)
    assert (b.member_epoch, b.assignment) == (2, {})
    assert env.group().members["b"].state is MemberState.UNRELEASED_PARTITIONS
    assert env.group().state.value == "Reconciling"
    target_b = env.group().target_of("b")[FOO]
    kept = tuple(p for p in range(6) if p not in target_b)
    # a is told to keep only its target; its epoch stays 1 until it has revoked the rest
    a = await env.heartbeat("a", 1, owned={FOO: tuple(range(6))})
    assert (a.member_epoch, a.assignment) == (1, {FOO: kept})
    assert env.group().members["a"].state is MemberState.UNREVOKED_PARTITIONS
    # b still gets nothing while a owns them
    assert (await env.heartbeat("b", 2, owned={})).assignment is None
    a = await env.heartbeat("a", 1, owned={FOO: kept})
    assert (a.member_epoch, a.assignment) == (2, None)
    b = await env.heartbeat("b", 2, owned={})
    assert (b.member_epoch, b.assignment) == (2, {FOO: target_b})
    assert env.group().state.value == "Stable"


async def test_leave_bumps_the_epoch_and_the_other_member_gets_everything(env: Env) -> None:
    await env.heartbeat("a", 0)
    await env.heartbeat("b", 0)
    a = await env.heartbeat("a", 1, owned={FOO: tuple(range(6))})
    await env.heartbeat("a", 1, owned=a.assignment)
    await env.heartbeat("b", 2, owned={})
    env.clear_records()
    left = await env.heartbeat("b", -1)
    assert (left.error, left.member_id, left.member_epoch) == (Errors.NONE, "b", -1)
    assert env.records == [Tombstone(RecordType.CURRENT_MEMBER_ASSIGNMENT, GROUP, "b"),
                           Tombstone(RecordType.TARGET_ASSIGNMENT_MEMBER, GROUP, "b"),
                           Tombstone(RecordType.MEMBER_METADATA, GROUP, "b"),
                           GroupEpochRecord(GROUP, 3, env.group().metadata_hash)]
    assert env.group().state.value == "Assigning"
    a = await env.heartbeat("a", 2, owned=a.assignment)
    assert (a.member_epoch, a.assignment) == (3, {FOO: tuple(range(6))})


async def test_session_expiry_fences_the_member_with_kafkas_line(env: Env, caplog) -> None:  # type: ignore
    await env.heartbeat("a", 0)
    await env.heartbeat("b", 0)
    for _ in range(3):  # a keeps heartbeating (and revokes what it is told to), b goes silent
        env.advance(14_000)
        a = env.group().members["a"]
        await env.heartbeat("a", a.member_epoch, owned=a.assigned)
    assert "b" in env.group().members
    with caplog.at_level(logging.INFO, logger="coordinator.group"):
        env.advance(SESSION_MS - 3 * 14_000)
    assert "b" not in env.group().members and env.group().group_epoch == 3
    assert "[GroupId g] Member b fenced from the group because the member session expired." in caplog.messages


async def test_a_member_that_does_not_revoke_is_fenced_at_its_rebalance_timeout(env: Env, caplog) -> None:
    await env.heartbeat("a", 0)
    await env.heartbeat("b", 0)
    await env.heartbeat("a", 1, owned={FOO: tuple(range(6))})  # told to revoke; keeps everything
    assert env.group().members["a"].state is MemberState.UNREVOKED_PARTITIONS
    env.advance(20_000)
    await env.heartbeat("a", 1, owned={FOO: tuple(range(6))})  # heartbeats keep the session, not the revocation
    with caplog.at_level(logging.INFO, logger="coordinator.group"):
        env.advance(10_000)
    assert "a" not in env.group().members
    assert ("[GroupId g] Member a fenced from the group because it failed to transition from epoch 1 within "
            "30000ms." in caplog.text)


async def test_epoch_validation(env: Env) -> None:
    await env.heartbeat("a", 0)
    ahead = await env.heartbeat("a", 5)
    assert ahead.error is Errors.FENCED_MEMBER_EPOCH and "greater member epoch (5)" in (ahead.message or "")
    unknown = await env.heartbeat("nobody", 1)
    assert (unknown.error, unknown.message) == (Errors.UNKNOWN_MEMBER_ID, "Member nobody is not a member of group g.")
    missing = await env.runtime.consumer_group_heartbeat(HeartbeatRequest("other", "x", 3, owned=[]))
    assert (missing.error, missing.message) == (Errors.GROUP_ID_NOT_FOUND, "Consumer group other not found.")


@pytest.mark.parametrize("fields, error, message", [
    (dict(member_id=""), Errors.INVALID_REQUEST, "MemberId can't be empty."),
    (dict(group_id=" "), Errors.INVALID_REQUEST, "GroupId can't be empty."),
    (dict(rack_id=""), Errors.INVALID_REQUEST, "RackId can't be empty."),
    (dict(rebalance_timeout_ms=-1), Errors.INVALID_REQUEST, "RebalanceTimeoutMs must be provided in first request."),
    (dict(owned=None), Errors.INVALID_REQUEST, "TopicPartitions must be empty when (re-)joining."),
    (dict(subscribed_topic_names=None), Errors.INVALID_REQUEST,
     "Either SubscribedTopicNames or SubscribedTopicRegex must be non-null when (re-)joining."),
    (dict(member_epoch=-3), Errors.INVALID_REQUEST, "MemberEpoch is invalid."),
    (dict(server_assignor="sticky"), Errors.UNSUPPORTED_ASSIGNOR,
     "ServerAssignor sticky is not supported. Supported assignors: uniform, range."),
])
async def test_invalid_requests_get_kafkas_errors(env: Env, fields: dict, error: Errors, message: str) -> None:
    base = dict(group_id=GROUP, member_id="m", member_epoch=0, rebalance_timeout_ms=30_000,
                subscribed_topic_names=("foo",), owned=[])
    response = await env.runtime.consumer_group_heartbeat(HeartbeatRequest(**{**base, **fields}))
    assert (response.error, response.message) == (error, message)
    assert env.group() is None and env.records == []


def test_consumer_group_timeouts_are_checked_like_kafkas() -> None:
    with pytest.raises(ValueError, match="group.consumer.session.timeout.ms must be within"):
        CoordinatorConfig(group_consumer_session_timeout_ms=10_000)
    CoordinatorConfig(group_consumer_session_timeout_ms=10_000, group_consumer_min_session_timeout_ms=10_000)
    with pytest.raises(ValueError, match="less than"):
        CoordinatorConfig(group_consumer_heartbeat_interval_ms=6_000, group_consumer_session_timeout_ms=6_000,
                          group_consumer_min_session_timeout_ms=1_000)


async def test_group_max_size(env: Env) -> None:
    small = Env(group_consumer_max_size=1)
    try:
        await small.heartbeat("a", 0)
        response = await small.heartbeat("b", 0)
        assert (response.error, response.message) == (
            Errors.GROUP_MAX_SIZE_REACHED, "The consumer group has reached its maximum capacity of 1 members.")
    finally:
        await small.runtime.shutdown()
        await small.timer.close()


async def test_range_assignor_on_request_and_describe(env: Env) -> None:
    await env.heartbeat("a", 0, topics=("foo", "bar"), server_assignor="range")
    await env.heartbeat("b", 0, topics=("foo", "bar"), server_assignor="range")
    group = env.group()
    assert group.target_of("a") == {FOO: (0, 1, 2), BAR: (0, 1)} and group.target_of("b") == {FOO: (3, 4, 5),
                                                                                            BAR: (2,)}
    [described] = await env.runtime.consumer_group_describe([GROUP])
    assert (described.state, described.group_epoch, described.assignment_epoch, described.assignor_name) == (
        "Reconciling", 2, 2, "range")
    by_id = {m.member_id: m for m in described.members}
    assert {p.topic_name for p in by_id["b"].target_assignment} == {"foo", "bar"}
    assert by_id["b"].assignment == () and by_id["a"].member_epoch == 1
    [unknown, empty] = await env.runtime.consumer_group_describe(["nope", ""])
    assert (unknown.error, unknown.message) == (Errors.GROUP_ID_NOT_FOUND, "Group nope not found.")
    assert empty.error is Errors.INVALID_GROUP_ID


async def test_a_member_subscribed_to_nothing_still_moves_a_new_group_to_epoch_1(env: Env) -> None:
    response = await env.heartbeat("a", 0, topics=())
    assert (response.error, response.member_epoch, response.assignment) == (Errors.NONE, 1, {})
    assert env.group().state.value == "Stable"


async def test_new_partitions_bump_the_epoch(env: Env) -> None:
    await env.heartbeat("a", 0)
    env.topics.put(TopicImage(FOO, "foo", 8))
    assert (await env.heartbeat("a", 1)).assignment is None  # seen at the next metadata refresh, not before
    env.advance(5_000)
    response = await env.heartbeat("a", 1)
    assert (response.member_epoch, response.assignment) == (2, {FOO: tuple(range(8))})


async def test_replaying_the_records_rebuilds_the_group(env: Env) -> None:
    from coordinator.group.modern.group import ConsumerGroup
    from coordinator.storage.consumer_records import decode, encode_key, encode_value

    await env.heartbeat("a", 0)
    await env.heartbeat("b", 0)
    await env.heartbeat("a", 1, owned={FOO: tuple(range(6))})
    await env.heartbeat("c", 0)
    await env.heartbeat("c", -1)
    loaded = ConsumerGroup(GROUP)
    for record in env.records:
        loaded.replay(decode(encode_key(record), encode_value(record)))
    live = env.group()
    assert (loaded.group_epoch, loaded.assignment_epoch, loaded.members, loaded.targets) == (
        live.group_epoch, live.assignment_epoch, live.members, live.targets)
    assert loaded.state == live.state


async def test_static_member_leaves_for_now_and_gets_its_partitions_back(env: Env) -> None:
    await env.heartbeat("a", 0, instance_id="i-a")
    await env.heartbeat("b", 0, instance_id="i-b")
    a = await env.heartbeat("a", 1, owned={FOO: tuple(range(6))}, instance_id="i-a")
    await env.heartbeat("a", 1, owned=a.assignment, instance_id="i-a")
    b = await env.heartbeat("b", 2, owned={}, instance_id="i-b")
    assert env.group().state.value == "Stable"
    env.clear_records()
    left = await env.heartbeat("b", -2, instance_id="i-b")
    assert (left.error, left.member_id, left.member_epoch) == (Errors.NONE, "b", -2)
    assert env.records == [CurrentAssignmentRecord(GROUP, "b", -2, 2, 0, {FOO: b.assignment[FOO]}, {})]
    assert env.group().group_epoch == 2  # no rebalance: the instance is expected back
    busy = await env.heartbeat("c", 0, instance_id="i-a")
    assert busy.error is Errors.UNRELEASED_INSTANCE_ID
    assert busy.message == "Static member c with instance id i-a cannot join the group because the instance id is " \
                           "owned by a member."
    env.clear_records()
    back = await env.heartbeat("b2", 0, instance_id="i-b")
    assert (back.error, back.member_epoch, back.assignment) == (Errors.NONE, 2, b.assignment)
    assert env.records[:6] == [
        Tombstone(RecordType.CURRENT_MEMBER_ASSIGNMENT, GROUP, "b"),
        Tombstone(RecordType.TARGET_ASSIGNMENT_MEMBER, GROUP, "b"),
        Tombstone(RecordType.MEMBER_METADATA, GROUP, "b"), env.records[3],
        TargetAssignmentRecord(GROUP, "b2", b.assignment),
        CurrentAssignmentRecord(GROUP, "b2", 0, 0, 0, b.assignment, {})]
    assert set(env.group().members) == {"a", "b2"} and env.group().group_epoch == 2
    assert env.group().static_members == {"i-a": "a", "i-b": "b2"}
    old = await env.heartbeat("b", 2, instance_id="i-b")
    assert (old.error, old.message) == (Errors.FENCED_INSTANCE_ID,
                                        "Static member b with instance id i-b was fenced by member b2.")
    unknown = await env.heartbeat("z", 2, instance_id="i-z")
    assert (unknown.error, unknown.message) == (Errors.UNKNOWN_MEMBER_ID, "Instance id i-z is unknown.")


async def test_static_member_that_does_not_come_back_is_fenced_at_its_session_timeout(env: Env) -> None:
    await env.heartbeat("a", 0, instance_id="i-a")
    await env.heartbeat("b", 0)
    await env.heartbeat("a", -2, instance_id="i-a")
    for _ in range(4):
        env.advance(12_000)
        b = env.group().members["b"]
        await env.heartbeat("b", b.member_epoch, owned=b.assigned)
    assert set(env.group().members) == {"b"}
    b = env.group().members["b"]
    assert b.assigned == {FOO: tuple(range(6))} and b.member_epoch == env.group().group_epoch == 3


async def test_static_member_leaving_for_good(env: Env) -> None:
    await env.heartbeat("a", 0, instance_id="i-a")
    response = await env.heartbeat("a", -1, instance_id="i-a")
    assert (response.error, response.member_epoch) == (Errors.NONE, -1)
    assert env.group().members == {} and env.group().static_members == {} and env.group().state.value == "Empty"


async def test_offset_commit_uses_the_member_epoch(env: Env) -> None:
    from coordinator.group.api import (OffsetCommitRequest, OffsetCommitRequestPartition, OffsetCommitRequestTopic,
                                       OffsetFetchRequest)

    await env.heartbeat("a", 0)

    def commit(member_id: str, epoch: int, version: int = 9) -> Errors:
        return OffsetCommitRequest(GROUP, epoch, member_id, [OffsetCommitRequestTopic(
            "foo", [OffsetCommitRequestPartition(0, 42)])], version=version)

    async def error_of(request) -> Errors:  # type: ignore[no-untyped-def]
        return (await env.runtime.commit_offsets(request)).topics[0].partitions[0].error_code

    assert await error_of(commit("a", 0)) is Errors.STALE_MEMBER_EPOCH
    assert await error_of(commit("x", 1)) is Errors.UNKNOWN_MEMBER_ID
    assert await error_of(commit("a", 1, version=8)) is Errors.UNSUPPORTED_VERSION
    assert await error_of(commit("a", 1)) is Errors.NONE
    fetched = await env.runtime.fetch_offsets(OffsetFetchRequest(GROUP, None))
    assert [(t.name, p.partition_index, p.committed_offset) for t in fetched.topics for p in t.partitions] == [
        ("foo", 0, 42)]
    await env.heartbeat("a", -1)
    assert await error_of(commit("", -1)) is Errors.NONE  # an empty group takes commits without a member


async def test_list_and_describe_groups_see_the_consumer_group(env: Env) -> None:
    from coordinator.group.api import DescribeGroupsRequest, ListGroupsRequest

    await env.heartbeat("a", 0)
    listed = (await env.runtime.list_groups(ListGroupsRequest())).groups
    assert [(g.group_id, g.protocol_type, g.group_state, g.group_type) for g in listed] == [
        (GROUP, "consumer", "Stable", "consumer")]
    assert (await env.runtime.list_groups(ListGroupsRequest(types_filter=["classic"]))).groups == []
    assert (await env.runtime.list_groups(ListGroupsRequest(states_filter=["stable"]))).groups == listed
    [described] = (await env.runtime.describe_groups(DescribeGroupsRequest([GROUP], version=6))).groups
    assert (described.error_code, described.group_state) == (Errors.GROUP_ID_NOT_FOUND, "Dead")


async def test_a_loaded_group_serves_its_members_and_times_them_out(env: Env) -> None:
    await env.heartbeat("a", 0)
    await env.heartbeat("b", 0)
    await env.heartbeat("a", 1, owned={FOO: tuple(range(6))})  # a now owes revocations (UNREVOKED)
    await asyncio.sleep(0)
    records = list(env.store.consumer_records)
    other = Env()  # another instance: replays the partition's records, then serves the group
    try:
        shard = other.runtime.shard_for(GROUP)
        for record in records:
            other.runtime.consumer_groups.replay(shard, record)
        other.runtime.consumer_groups.on_loaded(shard)
        group = other.group()
        assert (group.group_epoch, group.assignment_epoch, set(group.members)) == (2, 2, {"a", "b"})
        kept = group.members["a"].assigned[FOO]
        a = await other.heartbeat("a", 1, owned={FOO: kept})  # revoked: a moves to epoch 2
        assert (a.error, a.member_epoch) == (Errors.NONE, 2)
        other.advance(SESSION_MS - 1_000)
        await other.heartbeat("a", 2, owned={FOO: kept})
        other.advance(1_000)  # b never came back to the new instance
        assert set(other.group().members) == {"a"}
    finally:
        await other.runtime.shutdown()
        await other.timer.close()


async def test_classic_join_to_a_consumer_group(env: Env) -> None:
    from coordinator.group.api import JoinGroupProtocol, JoinGroupRequest

    def join() -> JoinGroupRequest:
        return JoinGroupRequest(group_id=GROUP, session_timeout_ms=10_000, rebalance_timeout_ms=10_000,
                                member_id="", group_instance_id=None, protocol_type="consumer",
                                protocols=[JoinGroupProtocol("range", b"")], version=9)

    await env.heartbeat("a", 0)
    # a classic member of a non-empty consumer group (test_consumer_group_mixed.py): asked for its id first
    asked = await env.runtime.join_group(join())
    assert asked.error_code is Errors.MEMBER_ID_REQUIRED and set(env.group().members) == {"a"}
    await env.heartbeat("a", -1)
    accepted = await env.runtime.join_group(join())  # the empty consumer group gives way
    assert accepted.error_code is Errors.MEMBER_ID_REQUIRED and env.group() is None
    # an Empty classic group (a pending member does not count) gives way to a consumer group, as in Kafka; the
    # pending member's join then meets a non-empty consumer group
    assert (await env.heartbeat("b", 0)).error is Errors.NONE
    pending = await env.runtime.join_group(dataclasses.replace(join(), member_id=accepted.member_id))
    assert pending.error_code is Errors.UNKNOWN_SERVER_ERROR  # its metadata is no ConsumerProtocol subscription


async def test_a_classic_group_with_members_is_not_a_consumer_group(env: Env) -> None:
    import asyncio

    from coordinator.group.api import JoinGroupProtocol, JoinGroupRequest

    first = await env.runtime.join_group(JoinGroupRequest(GROUP, 10_000, 10_000, "", None, "consumer",
                                                          [JoinGroupProtocol("range", b"")]))
    parked = asyncio.ensure_future(env.runtime.join_group(JoinGroupRequest(
        GROUP, 10_000, 10_000, first.member_id, None, "consumer", [JoinGroupProtocol("range", b"")])))
    await asyncio.sleep(0)
    busy = await env.heartbeat("b", 0)  # its metadata is no ConsumerProtocol subscription: it cannot be upgraded
    assert (busy.error, busy.message) == (Errors.GROUP_ID_NOT_FOUND, "Cannot upgrade classic group g to consumer "
                                          "group because the embedded consumer protocol is malformed.")
    assert (await env.heartbeat("b", 1)).message == "Group g is not a consumer group."
    [described] = await env.runtime.consumer_group_describe([GROUP])
    assert (described.error, described.message) == (Errors.GROUP_ID_NOT_FOUND, "Group g is not a consumer group.")
    parked.cancel()


async def test_the_store_holds_the_groups_for_a_restart(env: Env) -> None:
    await env.heartbeat("a", 0)
    await env.heartbeat("b", 0)
    await env.heartbeat("a", 1, owned={FOO: tuple(range(6))})
    restarted = Env()
    restarted.store = env.store  # the same state topic, read by a new runtime
    restarted.runtime = GroupRuntime(restarted.config, restarted.timer, env.store, restarted.clock)
    restarted.runtime.consumer_groups.topics = restarted.topics
    try:
        assert await restarted.runtime.load() >= 1
        group, live = restarted.group(), env.group()
        assert (group.group_epoch, group.assignment_epoch, group.members, group.targets) == (
            live.group_epoch, live.assignment_epoch, live.members, live.targets)
        b = await restarted.heartbeat("b", 2, owned={})
        assert (b.error, b.member_epoch) == (Errors.NONE, 2)
        restarted.advance(SESSION_MS)  # nobody else came back: a's session (re-armed at load) runs out
        assert "a" not in restarted.group().members
    finally:
        await restarted.runtime.shutdown()
        await restarted.timer.close()


async def test_a_failed_write_is_answered_with_kafkas_error(env: Env) -> None:
    env.store.fail_next_write(Errors.NOT_LEADER_OR_FOLLOWER)
    response = await env.heartbeat("a", 0)
    assert response.error is Errors.NOT_COORDINATOR
    env.store.fail_next_write(Errors.REQUEST_TIMED_OUT)
    assert (await env.heartbeat("b", 0)).error is Errors.COORDINATOR_NOT_AVAILABLE


async def test_regex_subscription_is_resolved_after_the_join(env: Env) -> None:
    from coordinator.group.modern.records import RegexRecord

    env.topics.put(TopicImage(uuid.UUID(int=0xF01), "foo-2", 2))
    joined = await env.heartbeat("a", 0, topics=None, subscribed_topic_regex="foo.*")
    assert (joined.error, joined.member_epoch, joined.assignment) == (Errors.NONE, 1, {})
    await env.resolved()  # the resolution, after the answer (as Kafka's executor runs it)
    [resolved, bumped] = env.records[-2:]
    assert isinstance(resolved, RegexRecord) and (resolved.regex, resolved.topics) == ("foo.*", ("foo", "foo-2"))
    assert isinstance(bumped, GroupEpochRecord) and bumped.epoch == 2
    a = await env.heartbeat("a", 1, owned={})
    assert (a.member_epoch, a.assignment) == (2, {FOO: tuple(range(6)), uuid.UUID(int=0xF01): (0, 1)})
    # a second subscriber of a resolved regular expression rebalances at once
    b = await env.heartbeat("b", 0, topics=None, subscribed_topic_regex="foo.*")
    assert b.member_epoch == 3 and env.group().target_of("b")
    # a new matching topic is picked up by the next refresh (at most every 10 s)
    env.topics.put(TopicImage(uuid.UUID(int=0xF02), "foo-3", 4))
    env.advance(10_001)
    await env.heartbeat("a", 2, owned=a.assignment)
    await env.resolved()
    assert env.group().resolved_regexes["foo.*"].topics == ("foo", "foo-2", "foo-3")
    assert env.group().group_epoch == 4


async def test_a_regex_resolves_to_the_topics_its_requester_may_describe(env: Env) -> None:
    """Kafka's filterTopicDescribeAuthorizedTopics: the principal of the heartbeat that asked for the resolution,
    the ACLs when it runs; the resolution is the group's, and an ACL change alone resolves nothing again."""
    from coordinator.security.authorizer import (Acl, Acls, Authorizer, Operation, PatternType, Permission,
                                                 ResourceType)

    authorizer = Authorizer()
    grants = [Acl(ResourceType.TOPIC, "foo", PatternType.LITERAL, "User:alice", "*", Operation.READ,
                  Permission.ALLOW)]
    authorizer.use(Acls(grants))

    def rights(principal: str):  # what ConnectionContext.describable_topics answers for that principal
        return lambda names: {name for name in names if authorizer.allows(
            principal, "127.0.0.1", Operation.DESCRIBE, ResourceType.TOPIC, name, audited=False)}

    env.topics.put(TopicImage(uuid.UUID(int=0xF01), "foo-2", 2))
    alice = rights("User:alice")
    a = await env.heartbeat("a", 0, topics=None, subscribed_topic_regex="foo.*", describable_topics=alice)
    await env.resolved()
    assert env.group().resolved_regexes["foo.*"].topics == ("foo",)  # foo-2 matches, alice may not describe it
    assert authorizer.refused == 0  # a filter's denial is not a refusal
    a = await env.heartbeat("a", a.member_epoch, owned={}, describable_topics=alice)
    assert (a.error, a.assignment) == (Errors.NONE, {FOO: tuple(range(6))})
    # bob may describe nothing, yet joins the resolution already made: it is the group's, not the member's
    bob = await env.heartbeat("b", 0, topics=None, subscribed_topic_regex="foo.*",
                              describable_topics=rights("User:bob"))
    assert bob.member_epoch == 3 and env.group().resolved_regexes["foo.*"].topics == ("foo",)

    async def refreshed() -> None:  # alice's heartbeat after the 10 s interval, and what it asked resolved
        env.advance(10_001)
        answer = await env.heartbeat("a", env.group().members["a"].member_epoch, owned=None,
                                     describable_topics=alice)
        assert answer.error is Errors.NONE
        await env.resolved()

    # a new ACL alone: the next refresh finds no new topic and keeps the resolution
    grants.append(dataclasses.replace(grants[0], name="foo-", pattern=PatternType.PREFIXED))
    authorizer.use(Acls(grants))
    await refreshed()
    assert env.group().resolved_regexes["foo.*"].topics == ("foo",)
    # a new topic: resolved again, under the ACLs now
    env.topics.put(TopicImage(uuid.UUID(int=0xF02), "foo-3", 4))
    await refreshed()
    assert env.group().resolved_regexes["foo.*"].topics == ("foo", "foo-2", "foo-3")


async def test_regexes_are_resolved_again_after_the_refresh_interval_and_written_unchanged() -> None:
    """Kafka 4.1's group.consumer.regex.refresh.interval.ms: with no topic created, a group's regular expressions
    are resolved again once the last resolution is older than it, and each resolution is written (record 16, a new
    timestamp) though its topics did not change (handleRegularExpressionsResult); the group epoch stays."""
    from coordinator.group.modern.records import RegexRecord

    env = Env(group_consumer_regex_refresh_interval_ms=20_000)
    try:
        await env.heartbeat("a", 0, topics=None, subscribed_topic_regex="foo.*")
        await env.resolved()
        first, epoch = env.group().resolved_regexes["foo.*"], env.group().group_epoch
        env.clear_records()

        async def heartbeat_after(ms: int) -> list[RegexRecord]:
            env.advance(ms)
            answer = await env.heartbeat("a", env.group().members["a"].member_epoch, owned=None)
            assert answer.error is Errors.NONE
            await env.resolved()
            return [r for r in env.records if isinstance(r, RegexRecord)]

        assert await heartbeat_after(10_001) == []  # past the 10 s batch interval, no topic created
        [again] = await heartbeat_after(10_000)
        assert again.topics == first.topics and again.timestamp_ms == first.timestamp_ms + 20_001
        assert env.group().group_epoch == epoch and not [r for r in env.records if isinstance(r, GroupEpochRecord)]
    finally:
        await env.runtime.shutdown()
        await env.timer.close()


async def test_invalid_regex_and_the_last_subscriber_leaving(env: Env) -> None:
    bad = await env.heartbeat("a", 0, topics=None, subscribed_topic_regex="(?=lookahead)")
    assert bad.error is Errors.INVALID_REGULAR_EXPRESSION
    assert (bad.message or "").startswith("SubscribedTopicRegex `(?=lookahead)` is not a valid regular expression: ")
    await env.heartbeat("a", 0, topics=None, subscribed_topic_regex="b.r")
    await env.resolved()
    assert env.group().resolved_regexes["b.r"].topics == ("bar",)
    env.clear_records()
    await env.heartbeat("a", -1)
    assert [getattr(r, "record_type", None) for r in env.records] == [
        RecordType.CURRENT_MEMBER_ASSIGNMENT, RecordType.TARGET_ASSIGNMENT_MEMBER, RecordType.MEMBER_METADATA,
        RecordType.REGULAR_EXPRESSION, RecordType.GROUP_METADATA]
    assert env.group().resolved_regexes == {}


async def test_offsets_of_subscribed_topics_never_expire_while_the_group_has_members(env: Env) -> None:
    from coordinator.group.api import OffsetCommitRequest, OffsetCommitRequestPartition, OffsetCommitRequestTopic

    await env.heartbeat("a", 0)
    for topic in ("foo", "bar"):
        request = OffsetCommitRequest(GROUP, 1, "a", [OffsetCommitRequestTopic(topic, [
            OffsetCommitRequestPartition(0, 5)])])
        assert (await env.runtime.commit_offsets(request)).topics[0].partitions[0].error_code is Errors.NONE
    env.clock.advance(env.config.offsets_retention_ms + 1)  # wall time only: no timer runs
    assert await env.runtime.expire_offsets() == 1  # bar: nobody subscribes to it
    assert set(env.runtime.groups[GROUP].offsets) == {("foo", 0)}


async def test_a_failed_write_reverts_the_group(env: Env) -> None:
    env.store.fail_next_write(Errors.NOT_ENOUGH_REPLICAS)
    assert (await env.heartbeat("a", 0)).error is Errors.COORDINATOR_NOT_AVAILABLE
    assert env.group() is None  # the group the failed join created is gone, as in Kafka
    await env.heartbeat("a", 0)
    env.store.fail_next_write(Errors.NOT_ENOUGH_REPLICAS)
    assert (await env.heartbeat("b", 0)).error is Errors.COORDINATOR_NOT_AVAILABLE
    group = env.group()
    assert (set(group.members), group.group_epoch, group.assignment_epoch, set(group.targets)) == ({"a"}, 1, 1, {"a"})
    retried = await env.heartbeat("b", 0)  # the client retries: the join happens as if for the first time
    assert (retried.error, retried.member_epoch) == (Errors.NONE, 2)


async def test_an_old_write_failing_late_does_not_revert_newer_writes(env: Env) -> None:
    """The creating join's write is still in flight when a later one is acknowledged and a third is sent; the first
    then fails. It is not the group's latest write, so nothing reverts (the deterministic simulator's history:
    a number that came back once the group's entry went made the old failure undo the group and its members)."""
    service = env.runtime.consumer_groups
    service.batch_targets = False  # each join its own write, answered with it (not its turn's batch)

    def join(member_id: str):  # type: ignore[no-untyped-def]
        response, write = service.heartbeat(HeartbeatRequest(GROUP, member_id, 0, rebalance_timeout_ms=30_000,
                                                             subscribed_topic_names=("foo",), owned=[]))
        assert response.error is Errors.NONE and write is not None and write.then is not None
        return write

    shard = env.runtime.shard_for(GROUP)
    append = shard.append
    shard.append = lambda write: None  # type: ignore[method-assign]  # what the failure writes again: not here
    try:
        creating, second = join("a"), join("b")
        second.then(Errors.NONE)
        third = join("c")
        creating.then(Errors.REQUEST_TIMED_OUT)
    finally:
        shard.append = append  # type: ignore[method-assign]
    assert set(env.group().members) == {"a", "b", "c"}
    third.then(Errors.NONE)
    assert set(env.group().members) == {"a", "b", "c"}


async def test_a_failed_write_memory_keeps_is_written_again_as_memory_has_it(env: Env) -> None:
    """b's join fails while c's join, computed on top of it, is in flight: memory keeps what b's write changed
    (only the latest write reverts), so the log gets memory's value of every key b's write wrote, after c's; then
    b itself, still as its failed join left it, is fenced (its client was told the join failed; Kafka reverts it):
    its records tombstoned and the epoch bumped, the next heartbeat recomputing the target without it."""
    service = env.runtime.consumer_groups
    service.batch_targets = False  # each join its own write, answered with it (not its turn's batch)
    await env.heartbeat("a", 0)
    appended = []
    shard = env.runtime.shard_for(GROUP)
    append = shard.append
    shard.append = lambda write: appended.append(write)  # type: ignore[method-assign]
    try:
        def join(member_id: str):  # type: ignore[no-untyped-def]
            response, write = service.heartbeat(HeartbeatRequest(GROUP, member_id, 0, rebalance_timeout_ms=30_000,
                                                                 subscribed_topic_names=("foo",), owned=[]))
            assert response.error is Errors.NONE and write is not None and write.then is not None
            return write

        failing, later = join("b"), join("c")
        kept = env.group().snapshot()  # memory as c's join left it
        failing.then(Errors.NOT_ENOUGH_REPLICAS)
        rewrite, undo = appended
    finally:
        shard.append = append  # type: ignore[method-assign]
    by_key = {(type(r).__name__, getattr(r, "member_id", None)): r for r in rewrite.records}
    assert by_key[("MemberMetadataRecord", "b")] == kept.members["b"].metadata_record(GROUP)
    assert by_key[("CurrentAssignmentRecord", "b")] == kept.members["b"].assignment_record(GROUP)
    assert by_key[("GroupEpochRecord", None)].epoch == kept.group_epoch == 3  # c's epoch, not b's 2
    assert by_key[("TargetAssignmentRecord", "a")].partitions == kept.targets["a"]
    group = env.group()
    assert undo.records == [Tombstone(RecordType.CURRENT_MEMBER_ASSIGNMENT, GROUP, "b"),
                            Tombstone(RecordType.TARGET_ASSIGNMENT_MEMBER, GROUP, "b"),
                            Tombstone(RecordType.MEMBER_METADATA, GROUP, "b"),
                            GroupEpochRecord(GROUP, 4, group.metadata_hash)]
    assert set(group.members) == {"a", "c"} and group.state.value == "Assigning"
    later.then(Errors.NONE)
    undo.then(Errors.NONE)
    a = await env.heartbeat("a", group.members["a"].member_epoch, owned=dict(group.members["a"].assigned))
    assert a.error is Errors.NONE and set(env.group().targets) == {"a", "c"}


@pytest.mark.parametrize("outcome", [None, Errors.NOT_ENOUGH_REPLICAS])
async def test_a_heartbeat_that_writes_nothing_waits_for_the_groups_earlier_write(env: Env,
                                                                                   outcome: Errors | None) -> None:
    """b's leave for now (-2) is written but not acknowledged yet: a's heartbeat changes nothing, and is answered
    only once b's write is acknowledged (Kafka completes it at the last written offset's commit); if that write
    fails, a is told to retry instead of hearing a state the log may never have."""
    await env.heartbeat("a", 0, instance_id="i-a")
    await env.heartbeat("b", 0, instance_id="i-b")
    a = await env.heartbeat("a", 1, owned={FOO: tuple(range(6))}, instance_id="i-a")
    await env.heartbeat("a", 1, owned=a.assignment, instance_id="i-a")
    await env.heartbeat("b", 2, owned={}, instance_id="i-b")
    gate = env.store.hold_next_write()
    if outcome is not None:
        env.store.fail_next_write(outcome)
    joining = asyncio.ensure_future(env.heartbeat("b", -2, instance_id="i-b"))
    await asyncio.sleep(0)
    steady = asyncio.ensure_future(env.heartbeat("a", 2, instance_id="i-a"))
    for _ in range(5):
        await asyncio.sleep(0)
    assert not steady.done()
    gate.set()
    answer = await steady
    await joining
    assert answer.error is (Errors.NONE if outcome is None else Errors.COORDINATOR_NOT_AVAILABLE)


async def test_offset_fetch_checks_the_member_epoch(env: Env) -> None:
    from coordinator.group.api import OffsetFetchRequest

    await env.heartbeat("a", 0)

    async def fetch(member_id: str | None, epoch: int) -> Errors:
        return (await env.runtime.fetch_offsets(OffsetFetchRequest(GROUP, None, member_id=member_id,
                                                                   member_epoch=epoch))).error_code

    assert await fetch(None, -1) is Errors.NONE  # an admin client
    assert await fetch("a", 1) is Errors.NONE
    assert await fetch("a", 0) is Errors.STALE_MEMBER_EPOCH
    assert await fetch("x", 1) is Errors.UNKNOWN_MEMBER_ID


async def _commit(env: Env, member_id: str, epoch: int, topic: str, offset: int) -> Errors:
    from coordinator.group.api import OffsetCommitRequest, OffsetCommitRequestPartition, OffsetCommitRequestTopic

    request = OffsetCommitRequest(GROUP, epoch, member_id, [OffsetCommitRequestTopic(
        topic, [OffsetCommitRequestPartition(0, offset)])])
    return (await env.runtime.commit_offsets(request)).topics[0].partitions[0].error_code


async def test_delete_groups_refuses_a_consumer_group_with_members_and_deletes_an_empty_one(env: Env) -> None:
    from coordinator.group.api import DeleteGroupsRequest
    from coordinator.group.records import OffsetCommitRecord

    async def delete() -> Errors:
        [result] = (await env.runtime.delete_groups(DeleteGroupsRequest([GROUP]))).results
        return result.error_code

    await env.heartbeat("a", 0, topics=None, subscribed_topic_regex="b.r")
    await env.resolved()
    assert await _commit(env, "a", env.group().members["a"].member_epoch, "foo", 7) is Errors.NONE
    assert await delete() is Errors.NON_EMPTY_GROUP  # with or without offsets, a member keeps the group
    await env.heartbeat("a", -1)
    env.clear_records()
    writes_before = len(env.store.writes)
    assert await delete() is Errors.NONE
    assert env.group() is None and GROUP not in env.runtime.groups
    # the offsets' tombstones, then the group's in Kafka's order; a member's records are gone with the leave
    assert [(r.record_type, r.member_id) for r in env.records] == [
        (RecordType.TARGET_ASSIGNMENT_METADATA, None), (RecordType.PARTITION_METADATA, None),
        (RecordType.GROUP_METADATA, None)]
    [write] = env.store.writes[writes_before:]  # one write, as Kafka's one batch: the offset's tombstone first
    assert isinstance(write[0], OffsetCommitRecord) and write[0].value is None and len(write) == 4
    assert GROUP not in env.store.offsets
    assert await delete() is Errors.GROUP_ID_NOT_FOUND
    from coordinator.group.api import OffsetFetchRequest
    assert (await env.runtime.fetch_offsets(OffsetFetchRequest(GROUP, None))).topics == []

    restarted = Env()  # the same state topic read again: nothing of the group comes back
    restarted.runtime = GroupRuntime(restarted.config, restarted.timer, env.store, restarted.clock)
    try:
        await restarted.runtime.load()
        assert restarted.group() is None and GROUP not in restarted.runtime.groups
        assert (await restarted.heartbeat("b", 0)).member_epoch == 1  # a new group, from its first epoch
    finally:
        await restarted.runtime.shutdown()
        await restarted.timer.close()


async def test_delete_groups_tombstones_every_member_record_of_a_loaded_group_in_kafkas_order(env: Env) -> None:
    from coordinator.group.modern.conversion import consumer_group_tombstones

    await env.heartbeat("a", 0)
    await env.heartbeat("b", 0, topics=None, subscribed_topic_regex="b.r")
    await env.resolved()
    kinds = [(t.record_type, t.member_id, t.regex) for t in consumer_group_tombstones(env.group())]
    assert kinds == [
        (RecordType.CURRENT_MEMBER_ASSIGNMENT, "a", None), (RecordType.CURRENT_MEMBER_ASSIGNMENT, "b", None),
        (RecordType.TARGET_ASSIGNMENT_MEMBER, "a", None), (RecordType.TARGET_ASSIGNMENT_MEMBER, "b", None),
        (RecordType.TARGET_ASSIGNMENT_METADATA, None, None),
        (RecordType.MEMBER_METADATA, "a", None), (RecordType.MEMBER_METADATA, "b", None),
        (RecordType.REGULAR_EXPRESSION, None, "b.r"),
        (RecordType.PARTITION_METADATA, None, None), (RecordType.GROUP_METADATA, None, None)]
    group = env.group().snapshot()
    for tombstone in consumer_group_tombstones(group):  # replaying them leaves nothing behind
        group.replay(tombstone)
    assert (group.deleted, group.members, group.targets, group.resolved_regexes) == (True, {}, {}, {})


async def test_offset_delete_keeps_the_offsets_of_topics_the_consumer_group_subscribes_to(env: Env) -> None:
    from coordinator.group.api import OffsetDeleteRequest, OffsetDeleteRequestTopic, OffsetFetchRequest

    async def delete(*topics: str) -> list[tuple[str, int, Errors]]:
        response = await env.runtime.delete_offsets(OffsetDeleteRequest(
            GROUP, [OffsetDeleteRequestTopic(t, [0, 1]) for t in topics]))
        assert response.error_code is Errors.NONE
        return [(t.name, p.partition_index, p.error_code) for t in response.topics for p in t.partitions]

    async def committed() -> set[tuple[str, int]]:
        fetched = await env.runtime.fetch_offsets(OffsetFetchRequest(GROUP, None))
        return {(t.name, p.partition_index) for t in fetched.topics for p in t.partitions}

    await env.heartbeat("a", 0, topics=("foo",), subscribed_topic_regex="b.r")
    await env.resolved()
    epoch = env.group().members["a"].member_epoch
    for topic in ("foo", "bar", "baz"):
        assert await _commit(env, "a", epoch, topic, 3) is Errors.NONE
    # foo by name and bar through the resolved regex are subscribed; baz is not (no offset for partition 1: NONE)
    assert await delete("foo", "bar", "baz") == [
        ("foo", 0, Errors.GROUP_SUBSCRIBED_TO_TOPIC), ("foo", 1, Errors.GROUP_SUBSCRIBED_TO_TOPIC),
        ("bar", 0, Errors.GROUP_SUBSCRIBED_TO_TOPIC), ("bar", 1, Errors.GROUP_SUBSCRIBED_TO_TOPIC),
        ("baz", 0, Errors.NONE), ("baz", 1, Errors.NONE)]
    assert await committed() == {("foo", 0), ("bar", 0)}
    assert env.group() is not None and env.group().members
    await env.heartbeat("a", -1)  # Empty: nothing is subscribed any more
    assert await delete("foo") == [("foo", 0, Errors.NONE), ("foo", 1, Errors.NONE)]
    assert await committed() == {("bar", 0)}
    missing = await env.runtime.delete_offsets(OffsetDeleteRequest("nobody", [OffsetDeleteRequestTopic("foo", [0])]))
    assert missing.error_code is Errors.GROUP_ID_NOT_FOUND


@pytest.mark.parametrize("regex, description", [
    ("[unclosed", "missing closing ]"), ("(abc", "missing closing )"), ("abc)", "regexp/syntax: internal error"),
    ("a**", "invalid nested repetition operator"), ("x{1001}", "invalid repeat count"),
    ("\\", "trailing backslash at end of expression"), ("*a", "missing argument to repetition operator"),
    ("(?=x)", "invalid or unsupported Perl syntax"), ("[z-a]", "invalid character class range")])
async def test_an_invalid_regex_is_described_as_re2j_describes_it(env: Env, regex: str, description: str) -> None:
    """Kafka 4.1.1's words (RE2/J's PatternSyntaxException description), as the differential harness saw them."""
    bad = await env.heartbeat("a", 0, topics=None, subscribed_topic_regex=regex)
    assert (bad.error, bad.message) == (
        Errors.INVALID_REGULAR_EXPRESSION, f"SubscribedTopicRegex `{regex}` is not a valid regular expression: "
        f"{description}.")


@pytest.mark.parametrize("by_regex", [False, True])
async def test_a_topic_growing_in_the_cluster_view_recomputes_the_target(by_regex: bool) -> None:
    """The relay's view of the cluster (ClusterMetadata) learns that a subscribed topic has more partitions: the
    next heartbeat after the refresh interval bumps the group epoch and the target has them, by name or through a
    regular expression. Its `version` stays: it counts topic names, which is what re-resolves regular
    expressions (Kafka re-resolves on new topics only, lastMetadataImageWithNewTopics)."""
    from types import SimpleNamespace

    from coordinator.relay.cluster import ClusterMetadata

    topic_id, count = uuid.UUID(int=5), [4]

    async def metadata(*_names: object) -> SimpleNamespace:
        return SimpleNamespace(topics=[SimpleNamespace(name="t", error_code=0, partitions=list(range(count[0])),
                                                       topic_id=topic_id)])

    env = Env()
    try:
        cluster = ClusterMetadata(metadata, 0, metadata)
        cluster.observe(await metadata(), all_topics=True)
        env.runtime.consumer_groups.topics = cluster
        env.runtime.consumer_groups.refresh_all_topics = lambda: cluster.refresh_all(0)
        env.runtime.refresh_topics = lambda names: cluster.refresh(names, 0)
        joined = await (env.heartbeat("a", 0, topics=None, subscribed_topic_regex="t") if by_regex
                        else env.heartbeat("a", 0, topics=("t",)))
        await env.resolved()
        steady = await env.heartbeat("a", joined.member_epoch)
        assert env.group().members["a"].assigned == {topic_id: (0, 1, 2, 3)} and cluster.version == 1
        epoch = env.group().group_epoch
        count[0] = 6
        env.advance(env.config.group_consumer_heartbeat_interval_ms)
        grown = await env.heartbeat("a", steady.member_epoch, owned={topic_id: (0, 1, 2, 3)})
        assert env.group().group_epoch == epoch + 1 and grown.member_epoch == epoch + 1
        assert grown.assignment == {topic_id: tuple(range(6))}
        assert cluster.version == 1
    finally:
        await env.runtime.shutdown()
        await env.timer.close()
