"""A DeleteGroups of a group already deleted whose tombstones are still owed (its first attempt failed while Kafka
refused writes or was unreachable, and the store's retry is not acknowledged yet), on the deterministic simulator:
the production runtime, store and tombstone writer over a simulated Kafka with injected faults, virtual time.

What Kafka 4.1 answers (group-coordinator, read from its source):
- `GroupCoordinatorShard.deleteGroups` validates each group (`GroupMetadataManager.validateDeleteGroup`: an unknown
  or Dead group is GROUP_ID_NOT_FOUND), then `OffsetMetadataManager.deleteAllOffsets` and
  `createGroupTombstoneRecordsAndCancelTimers` produce the tombstones, which the runtime replays into memory at
  once and appends.
- A failed append reverts memory: `CoordinatorRuntime.failCurrentBatch` → `revertLastWrittenOffset` →
  `SnapshotRegistry.revertToSnapshot`. The group is still there, Empty, with its offsets; so a second DeleteGroups
  validates it again, writes the tombstones again and is answered by that write: NONE once it is committed, else
  the failure as `CoordinatorOperationExceptionHelper.handleOperationException` maps it (UNKNOWN_TOPIC_OR_PARTITION,
  NOT_ENOUGH_REPLICAS, REQUEST_TIMED_OUT → COORDINATOR_NOT_AVAILABLE; NOT_LEADER_OR_FOLLOWER, KAFKA_STORAGE_ERROR →
  NOT_COORDINATOR), for every group of that partition in the request (`GroupCoordinatorService.deleteGroups`).
- A group whose deletion Kafka did write is gone: the next DeleteGroups answers GROUP_ID_NOT_FOUND.

Ours forgets the group at the first attempt and keeps its failed tombstones owed (storage/tombstones.py); a second
DeleteGroups writes the owed ones again (its offsets', then its own records': a classic group's metadata, a
consumer group's records) and is answered by that write: NONE means written, an error means not (the store's retry
may still land; a restart before it brings the group back, as Kafka would still have it). Once the retry is
acknowledged the group is gone and GROUP_ID_NOT_FOUND is Kafka's answer too. A second DeleteGroups while the
first one's write is unanswered (not failed yet) writes nothing and waits for that write: GROUP_ID_NOT_FOUND once it
is acknowledged, its error if it fails, as Kafka answers (CoordinatorRuntime defers a write that produced no records
until the pending one is committed, and fails it with that write's error).
"""
from __future__ import annotations

import asyncio
from typing import Any

import pytest

from coordinator.config import CoordinatorConfig
from coordinator.group.api import (DeleteGroupsRequest, DescribeGroupsRequest, JoinGroupProtocol, JoinGroupRequest,
                                   LeaveGroupRequest, ListGroupsRequest, MemberIdentity, OffsetCommitRequest,
                                   OffsetCommitRequestPartition, OffsetCommitRequestTopic, OffsetFetchRequest,
                                   OffsetFetchRequestTopic, SyncGroupRequest, SyncGroupRequestAssignment)
from coordinator.group.modern.heartbeat import HeartbeatRequest
from coordinator.group.modern.member import LEAVE_GROUP_MEMBER_EPOCH
from protocol.consumer_protocol import Subscription, encode_subscription
from protocol.error_codes import Errors
from simulator.instance import CoordinatorInstance
from simulator.kafka import KafkaFaults
from simulator.run import Scenario, Simulation, run_story

GROUP = "g"
PARTITIONS = [("t", 0), ("t", 1)]


class _Story:
    """One coordinator instance over a simulated Kafka with one state partition, driven by hand."""

    def __init__(self) -> None:
        scenario = Scenario(0, 0, CoordinatorConfig(offsets_topic_num_partitions=1), KafkaFaults(), [], [], None)
        self.sim = Simulation(scenario)

    async def loaded(self) -> CoordinatorInstance:
        instance = self.sim._start_instance()
        while not instance.loaded:
            await asyncio.sleep(0.1)
        return instance

    async def call(self, api: str, request: Any, member_id: str = "") -> Any:
        return await self.sim.call("tool", member_id, api, request)

    async def member_joined_and_left(self) -> None:
        """A classic member joins (generation 1), syncs and leaves: an Empty group whose metadata is in the log."""
        join = JoinGroupRequest(GROUP, 10_000, 10_000, "", None, "consumer",
                                [JoinGroupProtocol("range", encode_subscription(Subscription(("t",))))])
        answer = await self.call("join_group", join)
        assert answer.error_code == Errors.MEMBER_ID_REQUIRED, answer
        join.member_id = member_id = answer.member_id
        answer = await self.call("join_group", join, member_id)
        assert answer.error_code == Errors.NONE and answer.generation_id == 1, answer
        answer = await self.call("sync_group", SyncGroupRequest(
            GROUP, 1, member_id, assignments=[SyncGroupRequestAssignment(member_id, b"")]), member_id)
        assert answer.error_code == Errors.NONE, answer
        answer = await self.call("leave_group", LeaveGroupRequest(GROUP, [MemberIdentity(member_id)]), member_id)
        assert answer.error_code == Errors.NONE, answer

    async def consumer_member_joined_and_left(self) -> None:
        """A KIP-848 member joins (group epoch 1) and leaves: an Empty consumer group whose records are in the
        log."""
        answer = await self.call("consumer_group_heartbeat", HeartbeatRequest(
            GROUP, "member-0", 0, rebalance_timeout_ms=30_000, subscribed_topic_names=("other",), owned=()),
            "member-0")
        assert answer.error == Errors.NONE, answer
        answer = await self.call("consumer_group_heartbeat", HeartbeatRequest(
            GROUP, "member-0", LEAVE_GROUP_MEMBER_EPOCH), "member-0")
        assert answer.error == Errors.NONE, answer

    async def commit(self) -> None:
        request = OffsetCommitRequest(GROUP, -1, "", [OffsetCommitRequestTopic("t", [
            OffsetCommitRequestPartition(p, self.sim.next_offset(GROUP, ("t", p))) for _, p in PARTITIONS])])
        answer = await self.call("commit_offsets", request)
        assert [p.error_code for p in answer.topics[0].partitions] == [Errors.NONE] * len(PARTITIONS)
        for tp in PARTITIONS:
            self.sim.checkers.committed(GROUP, tp, 1, "tool")

    async def delete(self) -> Errors:
        answer = await self.call("delete_groups", DeleteGroupsRequest([GROUP]))
        error = Errors(answer.results[0].error_code)
        if error == Errors.NONE:
            self.sim.checkers.deleted(GROUP, PARTITIONS, group_record=True)
        return error

    async def seen(self) -> dict[str, Any]:
        """What the coordinator shows of the group: ListGroups, DescribeGroups' state, OffsetFetch."""
        listed = await self.call("list_groups", ListGroupsRequest())
        described = await self.call("describe_groups", DescribeGroupsRequest([GROUP]))
        fetched = await self.call("fetch_offsets", OffsetFetchRequest(GROUP, [OffsetFetchRequestTopic(
            "t", [p for _, p in PARTITIONS])]))
        return {"listed": [g.group_id for g in listed.groups], "state": described.groups[0].group_state,
                "offsets": [p.committed_offset for p in fetched.topics[0].partitions]}


def _deleted_again(generation: bool | str, fault: str, then: str, offsets: bool = True
                   ) -> tuple[list[Errors], dict[str, Any], list[str]]:
    """An Empty group with two committed offsets (`generation`: a classic member made generation 1, so its metadata
    is in the log and a DeleteGroups writes its tombstone; "consumer": a KIP-848 member made a consumer group and
    left, so its records are; False: a simple consumer's group, offsets only; without `offsets`, none). Kafka
    `fault` ("refused": NOT_ENOUGH_REPLICAS; "unreachable": an outage, the write times out) while the operator
    deletes the group; then (`then`) Kafka recovers ("recovered") or not ("down"), or recovers and the store's
    retry is acknowledged first ("retry_written"); the operator deletes the group again; the instance crashes and
    a new one loads with Kafka healthy. Returns both answers, what the new instance shows, and the violations."""
    story = _Story()
    sim = story.sim
    answers: list[Errors] = []
    seen: dict[str, Any] = {}

    def break_kafka() -> None:
        if fault == "refused":
            sim.kafka.faults.refuse = 1.0
        else:
            sim.kafka.go_down()

    def heal_kafka() -> None:
        sim.kafka.faults.refuse = 0.0
        if not sim.kafka.is_up:
            sim.kafka.come_up()

    async def run() -> None:
        first = await story.loaded()
        if generation == "consumer":
            await story.consumer_member_joined_and_left()
        elif generation:
            await story.member_joined_and_left()
        if offsets:
            await story.commit()
        break_kafka()
        answers.append(await story.delete())
        if then != "down":
            heal_kafka()
        if then == "retry_written":
            for _ in range(600):
                if first.store.unwritten_tombstones == 0:
                    break
                await asyncio.sleep(0.1)
            assert first.store.unwritten_tombstones == 0
        answers.append(await story.delete())
        first.crash()
        heal_kafka()
        await story.loaded()
        seen.update(await story.seen())

    run_story(sim, run())
    return answers, seen, [v.line() for v in sim.checkers.violations]


GONE = {"listed": [], "state": "Dead", "offsets": [-1, -1]}


@pytest.mark.parametrize("fault", ["refused", "unreachable"])
@pytest.mark.parametrize("generation", [True, False], ids=["group_tombstone", "offsets_only"])
def test_a_group_deleted_again_while_its_tombstones_are_owed_is_answered_by_writing_them_again(
        generation: bool, fault: str) -> None:
    """Kafka recovered before the second DeleteGroups: it writes the owed tombstones (the group's metadata and its
    offsets) again and answers NONE once they are written; a crash before the store's own retry does not bring
    the group back. (Before: GROUP_ID_NOT_FOUND at once, and the reload showed the group and its offsets.)"""
    answers, seen, violations = _deleted_again(generation, fault, "recovered")
    assert answers == [Errors.COORDINATOR_NOT_AVAILABLE, Errors.NONE]
    assert seen == GONE
    assert violations == []


@pytest.mark.parametrize("fault", ["refused", "unreachable"])
@pytest.mark.parametrize("generation", [True, False], ids=["group_tombstone", "offsets_only"])
def test_a_group_deleted_again_while_kafka_still_fails_is_not_reported_deleted(generation: bool, fault: str) -> None:
    """Kafka still failing: the second DeleteGroups' write fails too and is answered as Kafka answers a failed
    append (COORDINATOR_NOT_AVAILABLE), not GROUP_ID_NOT_FOUND: nothing was written, and the reload shows the group
    with its offsets, as Kafka would still have it."""
    answers, seen, violations = _deleted_again(generation, fault, "down")
    assert answers == [Errors.COORDINATOR_NOT_AVAILABLE, Errors.COORDINATOR_NOT_AVAILABLE]
    assert seen == {"listed": [GROUP], "state": "Empty", "offsets": [1, 1]}
    assert violations == []


@pytest.mark.parametrize("generation", [True, False], ids=["group_tombstone", "offsets_only"])
def test_a_group_whose_owed_tombstones_were_written_is_not_found(generation: bool) -> None:
    """The store's retry was acknowledged before the second DeleteGroups: the group is gone, as in Kafka after a
    written deletion: GROUP_ID_NOT_FOUND, nothing written again."""
    answers, seen, violations = _deleted_again(generation, "refused", "retry_written")
    assert answers == [Errors.COORDINATOR_NOT_AVAILABLE, Errors.GROUP_ID_NOT_FOUND]
    assert seen == GONE
    assert violations == []


def test_a_group_made_again_by_a_commit_while_its_tombstone_is_owed_is_deleted_with_that_tombstone() -> None:
    """The group (generation 1) is deleted while Kafka refuses (its metadata tombstone owed); Kafka recovers and a
    simple consumer commits under the same id before the retry: memory has a new Empty group of generation 0, whose
    deletion alone writes no metadata tombstone. In Kafka the deletion was reverted, so the group is the old one
    (generation 1) with the new offsets, and its DeleteGroups writes the metadata tombstone; ours writes the owed
    one with the offsets' tombstones, so a crash before the retry does not bring generation 1 back. (Without it the
    reload loads generation 1, Empty and without offsets, and its first cleanup retires it before anyone looks:
    the invariant checkers see it come back, durable_delete.)"""
    story = _Story()
    sim = story.sim
    answers: list[Errors] = []
    seen: dict[str, Any] = {}

    async def run() -> None:
        first = await story.loaded()
        await story.member_joined_and_left()
        await story.commit()
        sim.kafka.faults.refuse = 1.0
        answers.append(await story.delete())
        sim.kafka.faults.refuse = 0.0
        await story.commit()
        answers.append(await story.delete())
        first.crash()
        await story.loaded()
        seen.update(await story.seen())

    run_story(sim, run())
    assert answers == [Errors.COORDINATOR_NOT_AVAILABLE, Errors.NONE]
    assert seen == GONE
    assert [v.line() for v in sim.checkers.violations] == []


@pytest.mark.parametrize("offsets", [True, False], ids=["with_offsets", "without_offsets"])
def test_a_consumer_group_deleted_again_while_its_tombstones_are_owed_is_answered_by_writing_them_again(
        offsets: bool) -> None:
    """The same for a KIP-848 consumer group: its records' tombstones (group epoch, target assignment epoch,
    partition metadata) and its offsets' are written again; the reload shows no consumer group. Kafka 4.1 answers
    alike (ConsumerGroup.createGroupTombstoneRecords after deleteAllOffsets, reverted on a failed write)."""
    answers, seen, violations = _deleted_again("consumer", "refused", "recovered", offsets)
    assert answers == [Errors.COORDINATOR_NOT_AVAILABLE, Errors.NONE]
    assert seen == GONE
    assert violations == []


def _tombstone_writes(sim: Simulation) -> int:
    """Writes of tombstones only (a deletion's) the store issued so far."""
    return sum(1 for w in sim.ledger.writes if w.keys and all(value is None for _, value in w.keys))


@pytest.mark.parametrize("outcome", ["acknowledged", "refused"])
def test_a_group_deleted_again_while_its_deletion_is_unanswered_waits_for_that_write(outcome: str) -> None:
    """Kafka down while the operator deletes the group (its tombstones sent, unanswered) and deletes it again:
    the second DeleteGroups writes nothing and waits for the first write, as Kafka's does (validated against the
    uncommitted state: the group is gone, a write of no records deferred until the pending one is committed).
    Kafka comes back: the first write acknowledged, the second answer is GROUP_ID_NOT_FOUND; refused, it is the
    first write's error (NOT_ENOUGH_REPLICAS → COORDINATOR_NOT_AVAILABLE). (Before: the tombstones were written
    again and the second answered NONE, or with its own write's error.)"""
    story = _Story()
    sim = story.sim
    answers: list[Errors] = []
    writes: list[int] = []

    async def run() -> None:
        await story.loaded()
        await story.member_joined_and_left()
        await story.commit()
        before = _tombstone_writes(sim)
        sim.kafka.go_down()
        first = asyncio.ensure_future(story.delete())
        for _ in range(100):  # the first deletion's tombstones sent, not answered
            if _tombstone_writes(sim) > before:
                break
            await asyncio.sleep(0.01)
        assert _tombstone_writes(sim) == before + 1 and not first.done()
        second = asyncio.ensure_future(story.call("delete_groups", DeleteGroupsRequest([GROUP])))
        await asyncio.sleep(0.5)
        assert not second.done()
        if outcome == "refused":
            sim.kafka.faults.refuse = 1.0
        sim.kafka.come_up()
        answers.append(await first)
        answers.append(Errors((await second).results[0].error_code))
        writes.append(_tombstone_writes(sim) - before)

    run_story(sim, run())
    if outcome == "acknowledged":
        assert answers == [Errors.NONE, Errors.GROUP_ID_NOT_FOUND]
    else:
        assert answers == [Errors.COORDINATOR_NOT_AVAILABLE, Errors.COORDINATOR_NOT_AVAILABLE]
    assert writes == [1]  # the second DeleteGroups wrote nothing (the store's retry comes later)
    assert [v.line() for v in sim.checkers.violations] == []


def test_a_failed_write_is_the_answer_of_every_group_of_its_partition() -> None:
    """DeleteGroups of a deletable group and of an unknown one of the same partition while Kafka refuses writes:
    the partition's write fails and both are answered with its error, as GroupCoordinatorService.deleteGroups
    answers a failed shard write for every group of that partition in the request. (Before: the unknown group was
    answered GROUP_ID_NOT_FOUND.)"""
    story = _Story()
    sim = story.sim
    answers: list[tuple[str, Errors]] = []

    async def run() -> None:
        await story.loaded()
        await story.member_joined_and_left()
        sim.kafka.faults.refuse = 1.0
        answer = await story.call("delete_groups", DeleteGroupsRequest([GROUP, "unknown"]))
        answers.extend((r.group_id, Errors(r.error_code)) for r in answer.results)

    run_story(sim, run())
    assert answers == [(GROUP, Errors.COORDINATOR_NOT_AVAILABLE), ("unknown", Errors.COORDINATOR_NOT_AVAILABLE)]
