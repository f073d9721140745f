"""Classic members (JoinGroup/SyncGroup/Heartbeat/LeaveGroup) inside a KIP-848 consumer group, through the runtime on
a manual clock: the subscription read from the JoinGroup metadata, the server-side target delivered in SyncGroup,
revocation through REBALANCE_IN_PROGRESS, the classic member's session, join and sync timeouts, static
replacement, leave, and record 5 with its ClassicMemberMetadata."""

from __future__ import annotations

import asyncio
import logging
import uuid

import pytest

from coordinator.config import CoordinatorConfig
from coordinator.group.api import (JoinGroupProtocol, JoinGroupRequest, JoinGroupResponse, LeaveGroupRequest,
                                   MemberIdentity, OffsetCommitRequest, OffsetCommitRequestPartition,
                                   OffsetCommitRequestTopic, SyncGroupRequest, SyncGroupRequestAssignment)
from coordinator.group.modern.heartbeat import HeartbeatRequest, HeartbeatResponse
from coordinator.group.observer import GroupObserver, RebalanceCategory, RebalanceCause
from coordinator.group.modern.member import MemberState
from coordinator.group.modern.records import (ClassicMemberMetadata, CurrentAssignmentRecord, GroupEpochRecord,
                                              MemberMetadataRecord, RecordType, TargetAssignmentEpochRecord,
                                              TargetAssignmentRecord, Tombstone)
from coordinator.topics import StaticTopics, TopicImage
from coordinator.group.runtime import GroupRuntime
from coordinator.group.store import InMemoryGroupStore
from coordinator.storage.consumer_records import decode, encode_key, encode_value
from coordinator.timer import ManualClock, SystemTimer
from protocol.consumer_protocol import (Assignment, Subscription, decode_assignment, encode_assignment,
                                        encode_subscription)
from protocol.error_codes import Errors

FOO = uuid.UUID(int=0xF00)
GROUP = "mixed"
CLASSIC_SESSION_MS = 10_000
REBALANCE_MS = 30_000


class MixedEnv:
    """A runtime on a manual clock; consumer-protocol members heartbeat, classic ones join/sync/heartbeat."""

    def __init__(self, **config: object) -> None:
        self.clock = ManualClock(1_000_000)
        self.timer = SystemTimer("test", clock=self.clock, executor=lambda fn: fn())
        self.store = InMemoryGroupStore()
        self.config = CoordinatorConfig(**config)  # type: ignore[arg-type]
        self.runtime = GroupRuntime(self.config, self.timer, self.store, self.clock)
        self.runtime.consumer_groups.topics = StaticTopics([TopicImage(FOO, "foo", 6)])
        self._seen = 0

    @property
    def records(self) -> list:
        return self.store.consumer_records[self._seen:]

    def clear_records(self) -> None:
        self._seen = len(self.store.consumer_records)

    def group(self):  # type: ignore[no-untyped-def]
        return self.runtime.shard_for(GROUP).consumer_groups.get(GROUP)

    def advance(self, ms: int) -> None:
        self.clock.advance(ms)
        self.timer.advance_clock()

    async def heartbeat(self, member_id: str, epoch: int, owned: tuple[int, ...] | None = None,
                        **fields: object) -> HeartbeatResponse:
        if epoch == 0:
            fields.setdefault("subscribed_topic_names", ("foo",))
            fields.setdefault("rebalance_timeout_ms", REBALANCE_MS)
            owned = ()
        request = HeartbeatRequest(GROUP, member_id, epoch, owned=None if owned is None else [(FOO, owned)] if owned
                                   else [],
                                   client_id=member_id, client_host="/127.0.0.1", **fields)  # type: ignore[arg-type]
        return await self.runtime.consumer_group_heartbeat(request)

    async def join(self, member_id: str = "", owned: tuple[int, ...] = (), instance_id: str | None = None,
                   protocols: tuple[str, ...] = ("range",), version: int = 9, topics: tuple[str, ...] = ("foo",)
                   ) -> JoinGroupResponse:
        metadata = encode_subscription(Subscription(topics, owned_partitions=(("foo", owned),) if owned else ()),
                                       version=1)
        return await self.runtime.join_group(JoinGroupRequest(
            GROUP, CLASSIC_SESSION_MS, REBALANCE_MS, member_id, instance_id, "consumer",
            [JoinGroupProtocol(name, metadata) for name in protocols], version=version, client_id="classic",
            client_host="/127.0.0.1"))

    async def join_with_id(self, owned: tuple[int, ...] = ()) -> JoinGroupResponse:
        """A v4+ dynamic member: asked for its id first, then joins with it."""
        first = await self.join()
        assert first.error_code == Errors.MEMBER_ID_REQUIRED
        return await self.join(first.member_id, owned)

    async def sync(self, member_id: str, generation: int, assignments: dict[str, tuple[int, ...]] | None = None,
                   user_data: bytes | None = None) -> tuple[Errors, tuple[int, ...]]:
        """`assignments`: the leader's, member id -> partitions of foo (with an assignor's `user_data`)."""
        given = [SyncGroupRequestAssignment(m, encode_assignment(Assignment((("foo", ps),), user_data), 1))
                 for m, ps in (assignments or {}).items()]
        response = await self.runtime.sync_group(SyncGroupRequest(GROUP, generation, member_id,
                                                                  protocol_type="consumer", protocol_name="range",
                                                                  assignments=given))
        if response.error_code != Errors.NONE:
            return response.error_code, ()
        _, assignment = decode_assignment(response.assignment)
        return Errors.NONE, dict(assignment.partitions).get("foo", ())

    def classic_heartbeat(self, member_id: str, generation: int) -> Errors:
        return self.runtime.handle_heartbeat(GROUP, generation, member_id)


    async def classic_group(self, user_data: bytes | None = None) -> tuple[str, str]:
        """A Stable classic group of two members (the range assignor's split of foo); returns their ids."""
        ids = [(await self.join()).member_id for _ in range(2)]
        joins = [asyncio.ensure_future(self.join(member_id)) for member_id in ids]
        for _ in range(REBALANCE_MS // self.config.group_initial_rebalance_delay_ms + 2):  # the initial delay
            for _ in range(5):
                await asyncio.sleep(0)
            if all(j.done() for j in joins):
                break
            self.advance(self.config.group_initial_rebalance_delay_ms + 1)
        responses = await asyncio.wait_for(asyncio.gather(*joins), 5)
        leader = responses[0].leader
        assert {r.generation_id for r in responses} == {1}
        plan = {ids[0]: (0, 1, 2), ids[1]: (3, 4, 5)}
        results = await asyncio.gather(*(self.sync(m, 1, plan if m == leader else None, user_data) for m in ids))
        assert [r[1] for r in results] == [plan[m] for m in ids]
        return ids[0], ids[1]


@pytest.fixture
async def env():  # type: ignore[no-untyped-def]
    environment = MixedEnv()
    yield environment
    await environment.runtime.shutdown()
    await environment.timer.close()


async def test_classic_member_joins_a_consumer_group_and_gets_its_target_through_sync_group(env: MixedEnv) -> None:
    await env.heartbeat("a", 0)
    env.clear_records()
    joined = await env.join_with_id()
    member_id = joined.member_id
    # generation = member epoch; never the leader; the protocol it named
    assert (joined.error_code, joined.generation_id, joined.leader, joined.members) == (Errors.NONE, 2, "", [])
    assert (joined.protocol_type, joined.protocol_name) == ("consumer", "range")
    # Kafka's order: 5 (with its classic metadata), 3, 7 per changed target, 6, 8
    assert [type(r) for r in env.records] == [MemberMetadataRecord, GroupEpochRecord, TargetAssignmentRecord,
                                             TargetAssignmentRecord, TargetAssignmentEpochRecord,
                                             CurrentAssignmentRecord]
    metadata = env.records[0]
    assert metadata.subscribed_topic_names == ("foo",) and metadata.rebalance_timeout_ms == REBALANCE_MS
    assert metadata.classic is not None and metadata.classic.session_timeout_ms == CLASSIC_SESSION_MS
    assert [name for name, _ in metadata.classic.protocols] == ["range"]
    # its partitions are still a's: SyncGroup delivers nothing yet, the heartbeat asks it to rejoin later
    target = env.group().target_of(member_id)[FOO]
    assert await env.sync(member_id, 2) == (Errors.NONE, ())
    assert env.group().members[member_id].state is MemberState.UNRELEASED_PARTITIONS
    # a revokes what the classic member is to get
    kept = tuple(p for p in range(6) if p not in target)
    assert (await env.heartbeat("a", 1, owned=tuple(range(6)))).assignment == {FOO: kept}
    assert (await env.heartbeat("a", 1, owned=kept)).member_epoch == 2
    # the partitions are free now: the classic member is told to rejoin, and then gets them
    assert env.classic_heartbeat(member_id, 2) == Errors.REBALANCE_IN_PROGRESS
    rejoined = await env.join(member_id)
    assert (rejoined.error_code, rejoined.generation_id) == (Errors.NONE, 2)
    assert await env.sync(member_id, 2) == (Errors.NONE, target)
    assert env.classic_heartbeat(member_id, 2) == Errors.NONE
    assert env.group().state.value == "Stable"
    # ConsumerGroupDescribe v1 tells the two kinds apart (KIP-1099)
    [described] = await env.runtime.consumer_group_describe([GROUP])
    assert {m.member_id: m.member_type for m in described.members} == {"a": 1, member_id: 0}


async def test_classic_member_holding_partitions_revokes_before_a_new_member_gets_them(env: MixedEnv) -> None:
    await env.heartbeat("a", 0)
    classic = (await env.join_with_id()).member_id
    # a gives up the classic member's share, the classic member takes it
    target = env.group().target_of(classic)[FOO]
    kept = tuple(p for p in range(6) if p not in target)
    await env.heartbeat("a", 1, owned=tuple(range(6)))
    await env.heartbeat("a", 1, owned=kept)
    await env.join(classic)
    assert await env.sync(classic, 2) == (Errors.NONE, target)
    # a third member: the group epoch moves on, the classic member must rejoin and give partitions up
    await env.heartbeat("c", 0)
    assert env.classic_heartbeat(classic, 2) == Errors.REBALANCE_IN_PROGRESS
    assert await env.sync(classic, 2) == (Errors.REBALANCE_IN_PROGRESS, ())
    rejoined = await env.join(classic, owned=target)  # cooperative: still owns them when it rejoins
    new_target = env.group().target_of(classic)[FOO]
    assert set(new_target) < set(target)
    member = env.group().members[classic]
    assert member.state is MemberState.UNREVOKED_PARTITIONS and rejoined.generation_id == 2
    # the sync at the unchanged generation gives only what it keeps; heartbeats keep asking it to rejoin
    assert await env.sync(classic, 2) == (Errors.NONE, new_target)
    assert env.classic_heartbeat(classic, 2) == Errors.REBALANCE_IN_PROGRESS
    # rejoining without them completes the revocation and moves it to the group's epoch
    done = await env.join(classic, owned=new_target)
    assert (done.error_code, done.generation_id) == (Errors.NONE, 3)
    assert await env.sync(classic, 3) == (Errors.NONE, new_target)
    assert env.classic_heartbeat(classic, 3) == Errors.NONE


async def test_request_errors_of_a_classic_member(env: MixedEnv) -> None:
    await env.heartbeat("a", 0)
    classic = (await env.join_with_id()).member_id
    assert env.classic_heartbeat(classic, 7) == Errors.ILLEGAL_GENERATION
    assert env.classic_heartbeat("nobody", 2) == Errors.UNKNOWN_MEMBER_ID
    # a consumer-protocol member is not a classic one
    assert env.classic_heartbeat("a", 1) == Errors.UNKNOWN_MEMBER_ID
    assert (await env.sync("a", 1))[0] == Errors.UNKNOWN_MEMBER_ID
    # protocols the classic members do not all support
    assert (await env.join(protocols=("roundrobin",))).error_code == Errors.INCONSISTENT_GROUP_PROTOCOL
    # a classic member commits with its generation; a wrong one is ILLEGAL_GENERATION, not STALE_MEMBER_EPOCH
    commit = OffsetCommitRequest(GROUP, 5, classic, [OffsetCommitRequestTopic(
        "foo", [OffsetCommitRequestPartition(0, 10)])], version=8)
    [topic] = (await env.runtime.commit_offsets(commit)).topics
    assert topic.partitions[0].error_code == Errors.ILLEGAL_GENERATION
    commit.generation_id = 2
    [topic] = (await env.runtime.commit_offsets(commit)).topics
    assert topic.partitions[0].error_code == Errors.NONE


async def test_classic_member_fenced_at_its_session_timeout_and_sync_timeout(env: MixedEnv) -> None:
    await env.heartbeat("a", 0)
    classic = (await env.join_with_id()).member_id
    # no SyncGroup within the rebalance timeout: fenced
    env.advance(CLASSIC_SESSION_MS - 1)
    assert env.classic_heartbeat(classic, 2) == Errors.NONE  # keeps its session alive
    env.advance(REBALANCE_MS - CLASSIC_SESSION_MS + 2)
    assert classic not in env.group().members
    assert env.group().group_epoch == 3
    # another one that syncs but stops heartbeating goes at its (classic) session timeout
    await env.heartbeat("a", 1, owned=tuple(range(6)))
    other = (await env.join_with_id()).member_id
    generation = env.group().members[other].member_epoch
    assert (await env.sync(other, generation))[0] == Errors.NONE
    env.clear_records()
    env.advance(CLASSIC_SESSION_MS + 1)
    assert other not in env.group().members
    for _ in range(5):  # the fence's write is queued on the loop
        await asyncio.sleep(0)
    assert [(type(r), getattr(r, "record_type", None)) for r in env.records][:3] == [
        (Tombstone, RecordType.CURRENT_MEMBER_ASSIGNMENT), (Tombstone, RecordType.TARGET_ASSIGNMENT_MEMBER),
        (Tombstone, RecordType.MEMBER_METADATA)]


async def test_leave_group_of_a_classic_member(env: MixedEnv) -> None:
    await env.heartbeat("a", 0)
    classic = (await env.join_with_id()).member_id
    env.clear_records()
    response = await env.runtime.leave_group(LeaveGroupRequest(GROUP, [MemberIdentity(classic),
                                                                       MemberIdentity("a")]))
    assert [(m.member_id, m.error_code) for m in response.members] == [(classic, Errors.NONE),
                                                                     ("a", Errors.UNKNOWN_MEMBER_ID)]
    assert [type(r) for r in env.records] == [Tombstone, Tombstone, Tombstone, GroupEpochRecord]
    assert env.records[-1].epoch == 3 and set(env.group().members) == {"a"}


async def test_static_classic_member_replaces_its_predecessor_and_keeps_its_target(env: MixedEnv) -> None:
    await env.heartbeat("a", 0)
    first = await env.join(instance_id="i-1")
    assert first.error_code == Errors.NONE  # a static member needs no member id round trip
    target = env.group().target_of(first.member_id)
    epoch = env.group().group_epoch
    again = await env.join(instance_id="i-1")
    assert again.member_id != first.member_id and first.member_id not in env.group().members
    assert env.group().target_of(again.member_id) == target and env.group().group_epoch == epoch
    # the old member id is fenced
    response = await env.runtime.sync_group(SyncGroupRequest(GROUP, again.generation_id, first.member_id, "i-1"))
    assert response.error_code == Errors.FENCED_INSTANCE_ID


def test_record_5_with_classic_member_metadata_round_trips() -> None:
    record = MemberMetadataRecord(GROUP, "m", None, None, "client", "/127.0.0.1", ("foo",), None, 30_000, None,
                                  ClassicMemberMetadata(10_000, (("range", b"\x00\x01abc"), ("cooperative", b""))))
    assert decode(encode_key(record), encode_value(record)) == record
    consumer = MemberMetadataRecord(GROUP, "m", None, None, "client", "/127.0.0.1", ("foo",), None, 30_000, None)
    assert encode_value(consumer) is not None and len(encode_value(consumer)) < len(encode_value(record))
    assert decode(encode_key(consumer), encode_value(consumer)) == consumer


async def test_a_loaded_group_keeps_its_classic_members(env: MixedEnv) -> None:
    await env.heartbeat("a", 0)
    classic = (await env.join_with_id()).member_id
    runtime = GroupRuntime(CoordinatorConfig(), env.timer, env.store, env.clock)
    runtime.consumer_groups.topics = env.runtime.consumer_groups.topics
    runtime.consumer_groups.load(runtime.shard_for(GROUP), list(env.store.consumer_records))
    loaded = runtime.shard_for(GROUP).consumer_groups[GROUP].members[classic]
    assert loaded.classic == env.group().members[classic].classic and loaded.uses_classic_protocol
    for member_id in list(runtime.shard_for(GROUP).consumer_groups[GROUP].members):
        runtime.consumer_groups.cancel_all(GROUP, member_id)


async def test_online_upgrade_converts_a_classic_group_and_keeps_its_members(env: MixedEnv) -> None:
    first, second = await env.classic_group()
    joined = await env.heartbeat("c", 0)
    assert (joined.error, joined.member_epoch) == (Errors.NONE, 2)
    assert env.runtime.shard_for(GROUP).groups[GROUP].state.value == "Empty"  # only the offsets' holder
    group = env.group()
    # the classic members, STABLE at the classic generation with their assignments, now share with c
    for member_id, partitions in ((first, (0, 1, 2)), (second, (3, 4, 5))):
        member = group.members[member_id]
        assert (member.member_epoch, member.state, member.assigned) == (1, MemberState.STABLE, {FOO: partitions})
        assert member.classic is not None and member.classic.session_timeout_ms == CLASSIC_SESSION_MS
    # one write: the classic tombstone, then 5 5 3 7 7 6 8 8 (the conversion), then the joiner's records
    conversion = next(w for w in env.store.writes if any(getattr(r, "value", 0) is None for r in w[:1]))
    kinds = [type(r).__name__ for r in conversion]
    assert kinds[:9] == ["GroupMetadataRecord", "MemberMetadataRecord", "MemberMetadataRecord", "GroupEpochRecord",
                         "TargetAssignmentRecord", "TargetAssignmentRecord", "TargetAssignmentEpochRecord",
                         "CurrentAssignmentRecord", "CurrentAssignmentRecord"]
    assert conversion[3].epoch == 1 and conversion[9].member_id == "c"
    assert GROUP not in env.store.groups
    # the classic members learn of the new epoch, revoke through a rejoin and get their share
    for member_id, owned in ((first, (0, 1, 2)), (second, (3, 4, 5))):
        assert env.classic_heartbeat(member_id, 1) == Errors.REBALANCE_IN_PROGRESS
        rejoined = await env.join(member_id, owned=owned)
        target = env.group().target_of(member_id).get(FOO, ())
        kept = tuple(p for p in owned if p in target)
        assert rejoined.error_code == Errors.NONE
        assert await env.sync(member_id, rejoined.generation_id) == (Errors.NONE, kept)
        again = await env.join(member_id, owned=kept)
        assert (again.error_code, again.generation_id) == (Errors.NONE, 2)
    c = await env.heartbeat("c", 2, owned=())
    assert c.assignment == env.group().target_of("c")
    assert {m.member_epoch for m in env.group().members.values()} == {2}
    # a reload (another instance, or after a crash) sees the conversion whole: a consumer group, no classic one
    other = GroupRuntime(env.config, env.timer, env.store, env.clock)
    await other.load([env.runtime.partition_for(GROUP)])
    shard = other.shard_for(GROUP)
    assert set(shard.consumer_groups[GROUP].members) == {first, second, "c"}
    assert GROUP not in shard.groups or not shard.groups[GROUP].members
    for member_id in list(shard.consumer_groups[GROUP].members):
        other.consumer_groups.cancel_all(GROUP, member_id)


@pytest.mark.parametrize("policy", ["disabled", "downgrade"])
async def test_online_upgrade_refused_by_the_migration_policy(policy: str) -> None:
    env = MixedEnv(group_consumer_migration_policy=policy)
    try:
        await env.classic_group()
        refused = await env.heartbeat("c", 0)
        assert (refused.error, refused.message) == (Errors.GROUP_ID_NOT_FOUND, f"Cannot upgrade classic group "
                                                    f"{GROUP} to consumer group because online upgrade is disabled.")
        assert env.group() is None and env.runtime.shard_for(GROUP).groups[GROUP].state.value == "Stable"
        other = await env.heartbeat("c", 3, owned=())
        assert (other.error, other.message) == (Errors.GROUP_ID_NOT_FOUND, f"Group {GROUP} is not a consumer group.")
    finally:
        await env.runtime.shutdown()
        await env.timer.close()


async def test_online_downgrade_when_the_last_consumer_protocol_member_leaves(env: MixedEnv) -> None:
    await env.heartbeat("a", 0)
    classic = (await env.join_with_id()).member_id
    await env.runtime.commit_offsets(OffsetCommitRequest(GROUP, 1, "a", [OffsetCommitRequestTopic(
        "foo", [OffsetCommitRequestPartition(0, 42)])], version=9))
    epoch = env.group().group_epoch
    env_target = env.group().target_of(classic)[FOO]
    left = await env.heartbeat("a", -1)
    assert (left.error, left.member_epoch) == (Errors.NONE, -1)
    assert env.group() is None
    group = env.runtime.shard_for(GROUP).groups[GROUP]
    # a classic group at generation = group epoch, rebalancing, its member the classic one, the offsets kept
    assert (group.generation_id, group.state.value, list(group.members)) == (epoch, "PreparingRebalance", [classic])
    assert group.offsets[("foo", 0)].offset == 42
    # one write: the consumer group's tombstones in Kafka's order, then the classic group's record
    write = env.store.writes[-1]
    kinds = [(type(r).__name__, getattr(r, "record_type", None)) for r in write]
    assert kinds == [("Tombstone", RecordType.CURRENT_MEMBER_ASSIGNMENT)] * 2 + [
        ("Tombstone", RecordType.TARGET_ASSIGNMENT_MEMBER)] * 2 + [
        ("Tombstone", RecordType.TARGET_ASSIGNMENT_METADATA)] + [("Tombstone", RecordType.MEMBER_METADATA)] * 2 + [
        ("Tombstone", RecordType.PARTITION_METADATA), ("Tombstone", RecordType.GROUP_METADATA),
        ("GroupMetadataRecord", None)]
    assert write[-1].value.generation == epoch and [m.member_id for m in write[-1].value.members] == [classic]
    _, stored = decode_assignment(write[-1].value.members[0].assignment)  # its target as its assignment
    assert dict(stored.partitions).get("foo", ()) == env_target
    # the classic member learns of the rebalance, rejoins as the group's only member and leads it
    assert env.classic_heartbeat(classic, epoch) == Errors.REBALANCE_IN_PROGRESS
    rejoined = await asyncio.wait_for(env.join(classic), 5)
    assert (rejoined.error_code, rejoined.generation_id, rejoined.leader) == (Errors.NONE, epoch + 1, classic)
    assert await env.sync(classic, epoch + 1, {classic: tuple(range(6))}) == (Errors.NONE, tuple(range(6)))
    # a reload sees a classic group and no consumer group
    other = GroupRuntime(env.config, env.timer, env.store, env.clock)
    await other.load([env.runtime.partition_for(GROUP)])
    shard = other.shard_for(GROUP)
    assert GROUP not in shard.consumer_groups and list(shard.groups[GROUP].members) == [classic]
    await other.shutdown()


class _MemberEvents(GroupObserver):
    """How the observers hear of a consumer-protocol member going, and of the classic group's rebalance."""

    def __init__(self) -> None:
        self.events: list[tuple[object, ...]] = []

    def on_consumer_member_left(self, group_id: str, member_id: str, group_instance_id: str | None,
                                reason: str) -> None:
        self.events.append(("left", member_id, reason))

    def on_consumer_member_failed(self, group_id: str, member_id: str, group_instance_id: str | None, reason: str,
                                  category: RebalanceCategory) -> None:
        self.events.append(("failed", member_id, reason, category))

    def on_rebalance_started(self, group_id: str, generation: int, cause: RebalanceCause) -> None:
        self.events.append(("rebalance", cause.category, cause.text))


async def test_a_downgrade_by_session_expiry_is_told_as_the_members_fence(env: MixedEnv, caplog) -> None:  # type: ignore
    """The last consumer-protocol member's session runs out: Kafka logs the fence ("... fenced from the group
    because the member session expired.") and converts the group; the member is reported fenced, not left, and
    the classic group rebalances for a session timeout (with Kafka's reason text, the same as for a leave)."""
    events = _MemberEvents()
    env.runtime.observer = events
    await env.heartbeat("a", 0)
    joined = await env.join_with_id()
    classic, generation = joined.member_id, joined.generation_id
    assert (await env.sync(classic, generation))[0] == Errors.NONE
    with caplog.at_level(logging.INFO, logger="coordinator.group"):
        for _ in range(5):  # the classic member keeps its session, a goes silent past its 45 s
            env.advance(CLASSIC_SESSION_MS - 1_000)
            env.classic_heartbeat(classic, generation)
    assert env.group() is None and env.runtime.shard_for(GROUP).groups[GROUP].state.value == "PreparingRebalance"
    assert f"[GroupId {GROUP}] Member a fenced from the group because the member session expired." in caplog.messages
    assert [e for e in events.events if e[0] == "left"] == []
    assert ("failed", "a", "Member a fenced from the group because the member session expired.",
            RebalanceCategory.SESSION_TIMEOUT) in events.events
    assert ("rebalance", RebalanceCategory.SESSION_TIMEOUT,
            f"Downgrade group {GROUP} from consumer to classic for member leaving.") in events.events


async def test_a_classic_static_member_replacing_the_last_consumer_protocol_member_downgrades(env: MixedEnv
                                                                                             ) -> None:
    """Kafka 4.1's classicGroupJoinToConsumerGroup with validateOnlineDowngradeWithReplacedMember: the same
    subscription keeps the consumer group (the joiner inherits the target); another one converts it."""
    await env.heartbeat("a", 0, instance_id="i-a")
    classic = (await env.join_with_id()).member_id
    await env.heartbeat("a", -2, instance_id="i-a")
    same = await env.join(instance_id="i-a")  # the same subscription: still a consumer group, nothing moves
    assert same.error_code == Errors.NONE and env.group() is not None
    assert set(env.group().members) == {classic, same.member_id}
    await env.heartbeat("b", 0, instance_id="i-b")  # a consumer-protocol member again, then replaced
    epoch = env.group().group_epoch
    await env.heartbeat("b", -2, instance_id="i-b")
    env.clear_records()
    joined = await env.join(instance_id="i-b", topics=("foo", "bar"))
    assert (joined.error_code, joined.protocol_type) == (Errors.NONE, "consumer")
    assert env.group() is None
    group = env.runtime.shard_for(GROUP).groups[GROUP]
    assert group.state.value == "PreparingRebalance" and group.generation_id == epoch + 1
    assert set(group.members) == {classic, same.member_id, joined.member_id}
    write = env.store.writes[-1]  # one write: the replacement and its bump, the tombstones, the classic group
    kinds = [getattr(r, "record_type", None) for r in write]
    assert kinds[:7] == [RecordType.CURRENT_MEMBER_ASSIGNMENT, RecordType.TARGET_ASSIGNMENT_MEMBER,
                         RecordType.MEMBER_METADATA, RecordType.MEMBER_METADATA, RecordType.TARGET_ASSIGNMENT_MEMBER,
                         RecordType.CURRENT_MEMBER_ASSIGNMENT, RecordType.MEMBER_METADATA]
    assert kinds[7] == RecordType.GROUP_METADATA and write[7].epoch == epoch + 1
    assert kinds[-2:] == [RecordType.GROUP_METADATA, None] and type(write[-1]).__name__ == "GroupMetadataRecord"
    assert [m.member_id for m in write[-1].value.members] == [classic, same.member_id, joined.member_id]
    # answered with its member epoch (0: it took its predecessor's place and was not reconciled), so its SyncGroup
    # is of another generation than the classic group's: it joins again, as the classic members must
    assert joined.generation_id == 0
    assert (await env.sync(joined.member_id, joined.generation_id))[0] == Errors.ILLEGAL_GENERATION
    assert env.classic_heartbeat(classic, group.generation_id) == Errors.REBALANCE_IN_PROGRESS


async def test_no_downgrade_under_an_upgrade_only_policy() -> None:
    env = MixedEnv(group_consumer_migration_policy="upgrade")
    try:
        await env.heartbeat("a", 0)
        classic = (await env.join_with_id()).member_id
        await env.heartbeat("a", -1)
        assert set(env.group().members) == {classic}  # still a consumer group, with its classic member
        assert GROUP not in env.runtime.shard_for(GROUP).groups or not env.runtime.shard_for(GROUP).groups[
            GROUP].members
    finally:
        await env.runtime.shutdown()
        await env.timer.close()


async def test_a_failed_upgrade_write_leaves_the_classic_group_as_written(env: MixedEnv) -> None:
    first, second = await env.classic_group()
    env.store.fail_next_write(Errors.NOT_ENOUGH_REPLICAS)
    failed = await env.heartbeat("c", 0)
    assert failed.error == Errors.COORDINATOR_NOT_AVAILABLE  # Kafka 4's answer to that append error
    assert env.group() is None
    classic = env.runtime.shard_for(GROUP).groups[GROUP]
    assert (classic.state.value, classic.generation_id, set(classic.members)) == ("Stable", 1, {first, second})
    assert env.classic_heartbeat(first, 1) == Errors.NONE
    # the next attempt converts it
    assert (await env.heartbeat("c", 0)).error == Errors.NONE and set(env.group().members) == {first, second, "c"}


async def test_a_failed_downgrade_write_leaves_the_consumer_group(env: MixedEnv) -> None:
    await env.heartbeat("a", 0)
    classic = (await env.join_with_id()).member_id
    env.store.fail_next_write(Errors.NOT_ENOUGH_REPLICAS)
    failed = await env.heartbeat("a", -1)
    assert failed.error == Errors.COORDINATOR_NOT_AVAILABLE
    assert set(env.group().members) == {"a", classic}
    holder = env.runtime.shard_for(GROUP).groups.get(GROUP)
    assert holder is None or not holder.members
    assert env.classic_heartbeat(classic, env.group().members[classic].member_epoch) == Errors.NONE


async def test_a_classic_join_outside_the_session_timeout_bounds(env: MixedEnv) -> None:
    await env.heartbeat("a", 0)
    request = JoinGroupRequest(GROUP, 1_000, REBALANCE_MS, "", None, "consumer",
                               [JoinGroupProtocol("range", encode_subscription(Subscription(("foo",))))])
    assert (await env.runtime.join_group(request)).error_code == Errors.INVALID_SESSION_TIMEOUT


async def test_upgrade_of_a_rebalancing_classic_group_answers_its_parked_joins(env: MixedEnv) -> None:
    first, second = await env.classic_group()
    parked = asyncio.ensure_future(env.join(first, owned=(0, 1, 2)))  # a rejoin: the classic group rebalances
    for _ in range(5):
        await asyncio.sleep(0)
    assert not parked.done() and env.runtime.shard_for(GROUP).groups[GROUP].state.value == "PreparingRebalance"
    assert (await env.heartbeat("c", 0)).error == Errors.NONE
    assert (await asyncio.wait_for(parked, 5)).error_code == Errors.REBALANCE_IN_PROGRESS
    assert set(env.group().members) == {first, second, "c"}
    rejoined = await env.join(first, owned=(0, 1, 2))  # now a classic member of the consumer group
    assert rejoined.error_code == Errors.NONE and rejoined.generation_id == 1


async def test_no_upgrade_when_the_classic_assignor_keeps_user_data(env: MixedEnv) -> None:
    await env.classic_group(user_data=b"sticky")
    refused = await env.heartbeat("c", 0)
    assert (refused.error, refused.message) == (
        Errors.GROUP_ID_NOT_FOUND, f"Cannot upgrade classic group {GROUP} to consumer group because an unsupported "
        "custom assignor is in use. Please refer to the documentation or switch to a default assignor before "
        "re-attempting the upgrade.")
    assert env.group() is None and env.runtime.shard_for(GROUP).groups[GROUP].state.value == "Stable"


async def test_a_downgrade_in_the_middle_of_a_rebalance_ends_its_trace_as_converted(env: MixedEnv) -> None:
    """Kafka converts the group and rebalances the classic group for the conversion: the consumer group's
    rebalance under way is carried on by it, not failed; the classic member stays (it never left)."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import StatusCode

    from coordinator.group.observer import ObserverMux
    from coordinator.telemetry.consumer_tracing import ConsumerRebalanceTracer

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = ConsumerRebalanceTracer(provider.get_tracer("test"), lambda: env.clock.now_ms() * 1_000_000)
    env.runtime.observer = ObserverMux(tracer)
    await env.heartbeat("a", 0)
    await env.heartbeat("a", 1, owned=tuple(range(6)))
    classic = (await env.join_with_id()).member_id  # group epoch 2: a is to give partitions up
    assert env.group().state.value == "Reconciling"
    await env.heartbeat("a", -1)  # the last consumer-protocol member leaves mid-rebalance: downgraded
    assert env.group() is None
    assert env.runtime.shard_for(GROUP).groups[GROUP].state.value == "PreparingRebalance"
    [root] = [s for s in exporter.get_finished_spans() if s.name == "rebalance"
              and s.attributes["coordinator.group_epoch"] == 2]
    assert root.status.status_code is not StatusCode.ERROR, root.status
    assert root.attributes["coordinator.rebalance.outcome"] == "converted"
    assert root.attributes["coordinator.rebalance.converted_to"] == "classic"
    left = [e.attributes["coordinator.member.id"] for e in root.events if e.name == "member left"]
    assert left == ["a"]  # the classic member is carried over, not gone
    spans = [s for s in exporter.get_finished_spans() if s.name.startswith("reconcile ")]
    assert all(s.status.status_code is not StatusCode.ERROR for s in spans)
