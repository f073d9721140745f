"""Each invariant checker of the simulator fails on a deliberately broken history, and stays quiet on the
matching correct one: a checker that cannot fail is no checker."""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from coordinator.group.api import (HeartbeatResponse, OffsetCommitResponse, OffsetCommitResponsePartition,
                                   OffsetCommitResponseTopic)
from coordinator.group.metadata import GroupMetadata
from coordinator.group.modern.group import ConsumerGroup
from coordinator.group.modern.records import (CurrentAssignmentRecord, GroupEpochRecord, MemberMetadataRecord,
                                              RecordType, TargetAssignmentEpochRecord, TargetAssignmentRecord,
                                              Tombstone)
from coordinator.group.observer import GroupObserver
from coordinator.group.state import GroupState
from coordinator.group.status import ShardStatus
from coordinator.storage import consumer_records
from coordinator.group.records import GroupRecord, MemberRecord, OffsetRecord
from coordinator.storage.records import (GroupMetadataKey, OffsetCommitKey, encode_group_metadata_value,
                                         encode_key, encode_offset_commit_value)
from protocol.error_codes import Errors
from simulator.client_txns import Described
from simulator.consumer_protocol import topic_id
from simulator.history import History
from simulator.instance import Pending
from simulator.invariants import Checkers
from simulator.ledger import Ledger

GROUP = "g"
TP = ("t", 0)
KEY = (GROUP, "t", 0)


class World:
    def __init__(self) -> None:
        self.now = 0
        self.history = History(lambda: self.now)
        self.ledger = Ledger(self.history)
        self.checkers = Checkers(self.history, self.ledger, lambda: self.now)

    def commit_write(self, offset: int, status: str = "acked") -> int:
        key = encode_key(OffsetCommitKey(GROUP, *TP))
        write_id = self.ledger.issued("p", 0, [(0, key, encode_offset_commit_value(OffsetRecord(offset)))])
        self.ledger.outcome(write_id, status)
        return write_id

    def tombstone_write(self) -> None:
        write_id = self.ledger.issued("p", 0, [(0, encode_key(OffsetCommitKey(GROUP, *TP)), None)])
        self.ledger.outcome(write_id, "acked")

    def group_write(self, generation: int, members: dict[str, bytes], status: str = "acked",
                    producer: str = "p") -> None:
        record = GroupRecord("consumer", generation, "range", next(iter(members), None), 0, [
            MemberRecord(m, None, "c", "/h", 10_000, 10_000, b"", a) for m, a in members.items()])
        write_id = self.ledger.issued(producer, 0, [(0, encode_key(GroupMetadataKey(GROUP)),
                                                     encode_group_metadata_value(record))])
        self.ledger.outcome(write_id, status)

    def group_tombstone(self) -> None:
        write_id = self.ledger.issued("p", 0, [(0, encode_key(GroupMetadataKey(GROUP)), None)])
        self.ledger.outcome(write_id, "acked")

    def state(self, old: str, new: str, gen: int, inst: int = 0) -> None:
        self.history.record("state", inst=inst, group=GROUP, old=old, new=new, gen=gen)

    def invariants(self) -> set[str]:
        return {v.invariant for v in self.checkers.violations}


def loaded_instance(group: GroupMetadata | None, consumer_group: Any = None) -> SimpleNamespace:
    groups = {} if group is None else {group.group_id: group}
    shard = SimpleNamespace(consumer_groups={} if consumer_group is None else {GROUP: consumer_group},
                            status=ShardStatus.ACTIVE)
    return SimpleNamespace(number=1, name="coordinator-1", loaded=True, alive=True, pending={},
                           runtime=SimpleNamespace(groups=groups, num_partitions=1, partition_for=lambda g: 0,
                                                   shards=[shard], shard_for=lambda g: shard))


def group_with_offset(offset: int | None, state: GroupState = GroupState.EMPTY) -> GroupMetadata:
    group = GroupMetadata(GROUP, state, 0, GroupObserver())
    if offset is not None:
        group.offsets[TP] = OffsetRecord(offset)
    return group


# --- durable_commit ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fetched", [-1, 4])
def test_durable_commit_fails_when_an_acknowledged_commit_is_lost_or_regressed(fetched: int) -> None:
    world = World()
    world.commit_write(4)
    world.commit_write(5)
    world.checkers.committed(GROUP, TP, 5, "c")
    world.checkers.fetched(GROUP, TP, fetched, "c")
    assert world.invariants() == {"durable_commit"}


@pytest.mark.parametrize("fetched", [5, 6])
def test_durable_commit_holds_for_the_commit_or_a_later_one(fetched: int) -> None:
    world = World()
    world.commit_write(5)
    world.checkers.committed(GROUP, TP, 5, "c")
    world.commit_write(6, status="_MSG_TIMED_OUT")
    world.checkers.fetched(GROUP, TP, fetched, "c")
    assert world.invariants() == set()


def test_durable_commit_lets_a_later_tombstone_delete_it() -> None:
    world = World()
    world.commit_write(5)
    world.checkers.committed(GROUP, TP, 5, "c")
    world.tombstone_write()
    world.checkers.fetched(GROUP, TP, -1, "c")
    assert world.invariants() == set()


def test_durable_commit_fails_after_the_last_reload_too() -> None:
    world = World()
    world.commit_write(5)
    world.checkers.committed(GROUP, TP, 5, "c")
    world.checkers.final_offsets(loaded_instance(group_with_offset(None)))
    assert world.invariants() == {"durable_commit"}


# --- single_owner --------------------------------------------------------------------------------------------
def test_single_owner_fails_when_two_members_own_a_partition_in_one_generation() -> None:
    world = World()
    world.group_write(3, {"a": b"x", "b": b"y"})
    world.checkers.assigned(GROUP, 3, "a", [TP])
    world.checkers.assigned(GROUP, 3, "b", [TP])
    assert world.invariants() == {"single_owner"}


def test_single_owner_fails_when_a_member_is_told_two_assignments_for_one_generation() -> None:
    world = World()
    world.group_write(3, {"a": b"x"})
    world.checkers.assigned(GROUP, 3, "a", [TP])
    world.checkers.assigned(GROUP, 3, "a", [("t", 1)])
    assert world.invariants() == {"single_owner"}


def test_single_owner_holds_across_generations() -> None:
    world = World()
    world.group_write(3, {"a": b"x"})
    world.group_write(4, {"b": b"y"})
    world.checkers.assigned(GROUP, 3, "a", [TP])
    world.checkers.assigned(GROUP, 4, "b", [TP])
    assert world.invariants() == set()


# --- generation_once and transitions -------------------------------------------------------------------------
def test_generation_once_fails_when_a_generation_becomes_stable_twice() -> None:
    world = World()
    world.state("PreparingRebalance", "CompletingRebalance", 2)
    world.state("CompletingRebalance", "Stable", 2)
    world.state("PreparingRebalance", "CompletingRebalance", 2, inst=1)  # after a crash and a reload
    world.state("CompletingRebalance", "Stable", 2, inst=1)
    assert world.invariants() == {"generation_once"}


def test_transitions_fail_outside_kafkas_table() -> None:
    world = World()
    world.state("Empty", "Stable", 1)
    assert world.invariants() == {"transitions"}


def test_transitions_fail_when_a_change_does_not_start_where_the_group_was() -> None:
    world = World()
    world.state("Empty", "PreparingRebalance", 0)
    world.state("CompletingRebalance", "Stable", 1)  # it was PreparingRebalance
    assert world.invariants() == {"transitions"}


def test_transitions_and_generations_hold_for_a_normal_rebalance() -> None:
    world = World()
    for old, new, gen in [("Empty", "PreparingRebalance", 0), ("PreparingRebalance", "CompletingRebalance", 1),
                          ("CompletingRebalance", "Stable", 1), ("Stable", "PreparingRebalance", 1),
                          ("PreparingRebalance", "CompletingRebalance", 2), ("CompletingRebalance", "Stable", 2)]:
        world.state(old, new, gen)
    assert world.invariants() == set()


# --- session_expiry ------------------------------------------------------------------------------------------
def _heartbeat_answered(world: World, member: str, at_ms: int) -> None:
    world.now = at_ms
    pending = Pending(0, "heartbeat", GROUP, member, "c", at_ms, None)  # type: ignore[arg-type]
    world.checkers.answered(None, pending, HeartbeatResponse(Errors.NONE))  # type: ignore[arg-type]


@pytest.mark.parametrize("expired_at_ms, broken", [(10_999, True), (11_000, False)])
def test_session_expiry_fails_before_the_session_passed(expired_at_ms: int, broken: bool) -> None:
    world = World()
    _heartbeat_answered(world, "m", 1_000)
    world.now = expired_at_ms
    world.history.record("expired", inst=0, group=GROUP, member="m", session_ms=10_000)
    assert world.invariants() == ({"session_expiry"} if broken else set())


# --- parked_answered -----------------------------------------------------------------------------------------
def test_parked_answered_fails_for_a_request_left_parked() -> None:
    world = World()
    instance = loaded_instance(None)
    instance.pending = {7: Pending(7, "join_group", GROUP, "m", "c", 0, None)}  # type: ignore[arg-type]
    world.checkers.finish(instance)  # type: ignore[arg-type]
    assert world.invariants() == {"parked_answered"}
    quiet = World()
    quiet.checkers.finish(loaded_instance(None))  # type: ignore[arg-type]
    assert quiet.invariants() == set()


def test_parked_answered_fails_for_a_request_answered_too_late() -> None:
    world = World()
    world.now = 200_000
    pending = Pending(7, "join_group", GROUP, "m", "c", 0, None)  # type: ignore[arg-type]
    world.checkers.answered(None, pending, SimpleNamespace(error_code=Errors.NONE))  # type: ignore[arg-type]
    assert world.invariants() == {"parked_answered"}


# --- answer_after_ack ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("status", ["pending", "_MSG_TIMED_OUT", "NOT_ENOUGH_REPLICAS"])
def test_answer_after_ack_fails_for_a_commit_answered_before_its_acknowledgement(status: str) -> None:
    world = World()
    world.commit_write(5, status=status)
    world.checkers.committed(GROUP, TP, 5, "c")
    assert world.invariants() == {"answer_after_ack"}


def _sync_answered(world: World, instance: str) -> None:
    pending = Pending(0, "sync_group", GROUP, "a", "c", 0, None, generation=3)  # type: ignore[arg-type]
    world.checkers.answered(SimpleNamespace(name=instance), pending,  # type: ignore[arg-type]
                            SimpleNamespace(error_code=Errors.NONE))


def test_answer_after_ack_fails_for_a_sync_answered_before_its_group_record() -> None:
    world = World()
    world.group_write(3, {"a": b"x"}, status="_MSG_TIMED_OUT")
    _sync_answered(world, "p")  # the instance that wrote it was never told it landed
    assert world.invariants() == {"answer_after_ack"}
    acked = World()
    acked.group_write(3, {"a": b"x"})
    _sync_answered(acked, "p")
    assert acked.invariants() == set()


def test_answer_after_ack_lets_a_later_instance_serve_a_record_it_loaded() -> None:
    world = World()
    world.group_write(3, {"a": b"x"}, status="_MSG_TIMED_OUT")  # written by "p", maybe landed
    _sync_answered(world, "q")
    assert world.invariants() == set()


# --- reload_equals_acked -------------------------------------------------------------------------------------
@pytest.mark.parametrize("loaded", [None, 4, 7])
def test_reload_fails_when_the_loaded_offset_is_not_what_kafka_acknowledged(loaded: int | None) -> None:
    world = World()
    world.commit_write(4)
    world.commit_write(5)
    world.commit_write(7, status="NOT_ENOUGH_REPLICAS")  # refused: cannot be in the log
    world.checkers.after_load(loaded_instance(group_with_offset(loaded)))  # type: ignore[arg-type]
    assert world.invariants() == {"reload_equals_acked"}


@pytest.mark.parametrize("loaded", [5, 6])
def test_reload_may_show_the_acknowledged_offset_or_a_timed_out_later_one(loaded: int) -> None:
    world = World()
    world.commit_write(5)
    world.commit_write(6, status="_MSG_TIMED_OUT")
    world.checkers.after_load(loaded_instance(group_with_offset(loaded)))  # type: ignore[arg-type]
    assert world.invariants() == set()


def test_reload_fails_when_a_group_comes_back_with_another_generation() -> None:
    world = World()
    world.group_write(3, {"a": b"x"})
    group = group_with_offset(None, GroupState.STABLE)
    group.generation_id, group.protocol_type = 2, "consumer"
    world.checkers.after_load(loaded_instance(group))  # type: ignore[arg-type]
    assert world.invariants() == {"reload_equals_acked"}


def test_memory_before_a_crash_fails_when_it_holds_an_unacknowledged_offset() -> None:
    world = World()
    world.commit_write(5)
    world.commit_write(6, status="NOT_ENOUGH_REPLICAS")
    world.checkers.before_crash(loaded_instance(group_with_offset(6)))  # type: ignore[arg-type]
    assert world.invariants() == {"reload_equals_acked"}


@pytest.mark.parametrize("own_status, broken", [("acked", False), ("NOT_ENOUGH_REPLICAS", True)])
def test_memory_before_a_crash_is_judged_against_what_the_process_loaded_and_wrote(own_status: str,
                                                                                  broken: bool) -> None:
    # Seeds 14879, 16364: a paused instance's partition moved, the new owner wrote the group again; the zombie
    # crashed before it noticed. Its memory is what it loaded and wrote itself: the other's later write is not in
    # it — but a write of its own that Kafka refused still must not be.
    world = World()
    group = group_with_offset(None, GroupState.STABLE)
    group.generation_id, group.protocol_type = 3, "consumer"
    instance = loaded_instance(None)
    world.checkers.after_load(instance)  # type: ignore[arg-type]  # the partition loaded (nothing in it yet)
    world.group_write(3, {}, status=own_status, producer=instance.name)
    instance.runtime.groups[GROUP] = group
    world.group_write(4, {}, producer="coordinator-2")  # the next owner, after this one's load
    world.checkers.before_crash(instance)  # type: ignore[arg-type]
    assert world.invariants() == ({"reload_equals_acked"} if broken else set())


def _consumer_write(world: World, records: list[Any], status: str = "acked") -> None:
    write_id = world.ledger.issued("coordinator-1", 0, [(0, consumer_records.encode_key(r), consumer_records.encode_value(r))
                                            for r in records])
    world.ledger.outcome(write_id, status)


def _member_records(member_id: str, epoch: int, partitions: tuple[int, ...]) -> list[Any]:
    tid = topic_id("t")
    return [MemberMetadataRecord(GROUP, member_id, None, None, member_id, "/h", ("t",), None, 30_000, None),
            TargetAssignmentRecord(GROUP, member_id, {tid: partitions}),
            CurrentAssignmentRecord(GROUP, member_id, epoch, epoch - 1, 0, {tid: partitions})]


def _consumer_group_as_written(*writes: list[Any]) -> ConsumerGroup:
    group = ConsumerGroup(GROUP)
    for records in writes:
        for record in records:
            group.replay(record)
    return group


def test_memory_of_a_consumer_group_before_a_crash_holds_what_kafka_acknowledged() -> None:
    world = World()
    first = [GroupEpochRecord(GROUP, 1), *_member_records("a", 1, (0, 1)), TargetAssignmentEpochRecord(GROUP, 1)]
    _consumer_write(world, first)
    world.checkers.before_crash(loaded_instance(None, _consumer_group_as_written(first)))  # type: ignore[arg-type]
    assert world.invariants() == set()


def test_memory_of_a_consumer_group_before_a_crash_fails_when_it_dropped_a_member_whose_tombstones_kafka_refused(
        ) -> None:
    # Seed 652 of --protocol upgrade: the repair write of a member's tombstones refused and never sent again, so a
    # reload made the member again beside its successor with the same instance id.
    world = World()
    first = [GroupEpochRecord(GROUP, 1), *_member_records("a", 1, (0,)), *_member_records("b", 1, (1,)),
             TargetAssignmentEpochRecord(GROUP, 1)]
    _consumer_write(world, first)
    leave = [Tombstone(kind, GROUP, "b") for kind in (RecordType.CURRENT_MEMBER_ASSIGNMENT,
                                                       RecordType.TARGET_ASSIGNMENT_MEMBER,
                                                       RecordType.MEMBER_METADATA)] + [GroupEpochRecord(GROUP, 2)]
    _consumer_write(world, leave, status="NOT_ENOUGH_REPLICAS")
    memory = _consumer_group_as_written(first, leave)
    world.checkers.before_crash(loaded_instance(None, memory))  # type: ignore[arg-type]
    assert world.invariants() == {"reload_equals_acked"}


def test_memory_of_a_consumer_group_before_a_crash_fails_when_the_log_still_holds_a_group_memory_dropped() -> None:
    # Seed 1 of --protocol upgrade: an Empty consumer group replaced by a classic group without its tombstones.
    world = World()
    _consumer_write(world, [GroupEpochRecord(GROUP, 2), TargetAssignmentEpochRecord(GROUP, 1)])
    world.checkers.before_crash(loaded_instance(None))  # type: ignore[arg-type]
    assert world.invariants() == {"reload_equals_acked"}


def test_a_loaded_consumer_group_may_show_a_write_that_timed_out() -> None:
    world = World()
    first = [GroupEpochRecord(GROUP, 1), *_member_records("a", 1, (0, 1)), TargetAssignmentEpochRecord(GROUP, 1)]
    _consumer_write(world, first)
    second = [GroupEpochRecord(GROUP, 2), *_member_records("a", 2, (0,))]
    _consumer_write(world, second, status="_MSG_TIMED_OUT")
    for memory in (_consumer_group_as_written(first), _consumer_group_as_written(first, second)):
        world.checkers.after_load(loaded_instance(None, memory))  # type: ignore[arg-type]
    assert world.invariants() == set()
    world.checkers.after_load(loaded_instance(None, _consumer_group_as_written(  # type: ignore[arg-type]
        first, [CurrentAssignmentRecord(GROUP, "a", 3, 2, 0, {topic_id("t"): (1,)})])))
    assert world.invariants() == {"reload_equals_acked"}


# --- no_errors -----------------------------------------------------------------------------------------------
def test_no_errors_fails_for_an_error_a_consumer_cannot_expect() -> None:
    world = World()
    world.checkers.unexpected_error("c", "join", Errors.UNKNOWN_SERVER_ERROR)
    assert world.invariants() == {"no_errors"}


# --- durable_delete ------------------------------------------------------------------------------------------
def test_durable_delete_fails_when_deleted_offsets_come_back_with_a_reload() -> None:
    world = World()
    world.commit_write(5)
    world.checkers.deleted(GROUP, [TP], group_record=False)  # its tombstone failed: still owed at the crash
    world.checkers.after_load(loaded_instance(group_with_offset(5)))  # type: ignore[arg-type]
    assert world.invariants() == {"durable_delete"}


def test_durable_delete_lets_a_later_commit_bring_the_partition_back() -> None:
    world = World()
    world.commit_write(5)
    world.checkers.deleted(GROUP, [TP], group_record=False)
    world.commit_write(6)
    world.checkers.after_load(loaded_instance(group_with_offset(6)))  # type: ignore[arg-type]
    assert world.invariants() == set()


def test_durable_delete_fails_when_a_deleted_group_comes_back() -> None:
    world = World()
    world.group_write(3, {})
    world.checkers.deleted(GROUP, [], group_record=True)
    group = group_with_offset(None)
    group.generation_id, group.protocol_type = 3, "consumer"
    world.checkers.after_load(loaded_instance(group))  # type: ignore[arg-type]
    assert "durable_delete" in world.invariants()


@pytest.mark.parametrize("written_after_the_tombstone", [True, False])
def test_durable_delete_dates_a_deletion_from_its_tombstone(written_after_the_tombstone: bool) -> None:
    # Seed 18938: the group started a new life (JoinGroup, SyncGroup's record) while the deletion's tombstone
    # awaited its acknowledgement: written after the tombstone, it is legitimately back. A record written before
    # the tombstone (before the deletion was handled) is deleted by it: back after a reload, it is a violation.
    world = World()
    world.group_write(3, {})
    sent_at = len(world.ledger.writes)  # the DeleteGroups is sent
    if not written_after_the_tombstone:
        world.group_write(4, {})
    world.group_tombstone()  # the deletion is handled
    if written_after_the_tombstone:
        world.group_write(1, {})
    world.checkers.deleted(GROUP, [], group_record=True, sent_at=sent_at)  # then answered NONE
    group = group_with_offset(None)
    group.generation_id, group.protocol_type = (1 if written_after_the_tombstone else 4), "consumer"
    world.checkers.after_load(loaded_instance(group))  # type: ignore[arg-type]
    assert ("durable_delete" in world.invariants()) is not written_after_the_tombstone


# --- single_writer ---------------------------------------------------------------------------------------------
def _serving_instance(name: str, serving: set[int], paused: bool = False, suspended: bool = False
                      ) -> SimpleNamespace:
    return SimpleNamespace(name=name, number=1, alive=True, paused=paused, pending={},
                           ownership=SimpleNamespace(serving=lambda p: p in serving,
                                                     guard=SimpleNamespace(suspended=suspended)),
                           runtime=SimpleNamespace(partition_for=lambda group_id: 0, groups={}, num_partitions=1,
                                                   shards=[]))


def _served_by_first(second_serving: set[int], second_paused: bool = False) -> set[str]:
    world = World()
    first = _serving_instance("a", {0})
    second = _serving_instance("b", second_serving, second_paused)
    world.checkers.cluster = SimpleNamespace(coordinators=[first, second])
    pending = SimpleNamespace(api="heartbeat", group_id=GROUP, member_id="m", client="c", arrived_ms=0,
                              generation=None)
    world.checkers.answered(first, pending, HeartbeatResponse(Errors.NONE), "NONE")  # type: ignore[arg-type]
    return world.invariants()


def test_single_writer_fails_when_two_running_instances_serve_a_partition() -> None:
    assert _served_by_first({0}) == {"single_writer"}
    assert _served_by_first(set()) == set()
    assert _served_by_first({0}, second_paused=True) == set()  # a paused one learns it when it wakes


def _loaded_by_first(first_serving: set[int], suspended: bool = False) -> set[str]:
    """The first instance's load of partition 0 ends while the second serves it."""
    world = World()
    first = _serving_instance("a", first_serving, suspended=suspended)
    world.checkers.cluster = SimpleNamespace(coordinators=[first, _serving_instance("b", {0})])
    world.checkers.after_load(first, {0})  # type: ignore[arg-type]
    return world.invariants()


def test_single_writer_counts_a_load_for_what_the_loader_serves_once_it_is_done() -> None:
    assert _loaded_by_first({0}) == {"single_writer"}
    # lost while it loaded (a zombie's load, its fence sent when it woke: seed 7370): the shard stays UNOWNED,
    # nothing is answered from it
    assert _loaded_by_first(set()) == set()
    # loaded while the zombie guard is suspended: unloaded before any request could be answered from it
    assert _loaded_by_first({0}, suspended=True) == set()


def _timed_out_write(first_serving_then: set[int], second_serving_then: set[int], error: Errors) -> set[str]:
    """The first instance takes a commit in, then (after a pause) answers it while the second serves the
    partition."""
    world = World()
    first = _serving_instance("a", first_serving_then)
    second = _serving_instance("b", second_serving_then)
    world.checkers.cluster = SimpleNamespace(coordinators=[first, second])
    pending = Pending(0, "commit_offsets", GROUP, "m", "c", 0, None)  # type: ignore[arg-type]
    world.checkers.taken_in(first, pending)  # type: ignore[arg-type]
    first.ownership.serving = lambda p: False  # the guard took it out of service when it woke
    second.ownership.serving = lambda p: p == 0  # Kafka gave it to the second meanwhile
    answer = OffsetCommitResponse([OffsetCommitResponseTopic("t", [OffsetCommitResponsePartition(0, error)])])
    world.checkers.answered(first, pending, answer, error.name)  # type: ignore[arg-type]
    return world.invariants()


def test_single_writer_judges_a_timed_out_write_by_when_it_was_taken_in() -> None:
    # taken in as the partition's only server, its write timed out across a pause (seed 23851): the answer tells
    # only that the outcome is unknown (the fence decides it), nothing of the group
    assert _timed_out_write({0}, set(), Errors.REQUEST_TIMED_OUT) == set()
    # taken in while another instance served the partition: a zombie that took a write in
    assert _timed_out_write({0}, {0}, Errors.REQUEST_TIMED_OUT) == {"single_writer"}
    assert _timed_out_write(set(), set(), Errors.REQUEST_TIMED_OUT) == {"single_writer"}
    # any other answer is judged when it is given
    assert _timed_out_write({0}, set(), Errors.NONE) == {"single_writer"}
    assert _timed_out_write({0}, set(), Errors.ILLEGAL_GENERATION) == {"single_writer"}


def test_a_fetch_sent_before_a_commit_was_answered_may_miss_it() -> None:
    world = World()
    world.now = 1_000
    world.commit_write(33)
    world.checkers.committed(GROUP, TP, 33, "c")
    world.now = 2_000
    world.commit_write(34)
    world.checkers.committed(GROUP, TP, 34, "c")
    world.checkers.fetched(GROUP, TP, 33, "late", sent_ms=1_500)  # its answer was on the wire meanwhile
    assert world.invariants() == set()
    world.checkers.fetched(GROUP, TP, 33, "after", sent_ms=2_500)
    assert world.invariants() == {"durable_commit"}


def test_answer_after_ack_lets_the_writer_serve_a_record_it_loaded_again_since() -> None:
    world = World()
    world.group_write(3, {"a": b"x"}, status="txn:_TIMED_OUT")  # written by "p", maybe landed
    instance = loaded_instance(None)
    instance.name = "p"
    world.checkers.after_load(instance, {0})  # type: ignore[arg-type]  # p lost the partition and read it again
    _sync_answered(world, "p")
    assert world.invariants() == set()


# --- the consumer protocol ------------------------------------------------------------------------------------
def _consumer_instance(members: dict[str, dict[int, tuple[int, ...]]],
                       pending: dict[str, dict[int, tuple[int, ...]]] | None = None) -> SimpleNamespace:
    """An instance whose consumer group `g` has these members (member -> {partition of topic t: ...})."""
    from coordinator.group.modern.group import ConsumerGroup
    from coordinator.group.modern.member import ConsumerGroupMember
    from simulator.consumer_protocol import cluster_topics, topic_id

    tid = topic_id("t")
    group = ConsumerGroup(GROUP)
    for member_id, assigned in members.items():
        group.members[member_id] = ConsumerGroupMember(
            member_id, assigned={tid: ps for ps in assigned.values()},
            pending_revocation={tid: ps for ps in (pending or {}).get(member_id, {}).values()})
    shard = SimpleNamespace(consumer_groups={GROUP: group})
    runtime = SimpleNamespace(shard_for=lambda _group: shard,
                              consumer_groups=SimpleNamespace(topics=cluster_topics({"t": 4})))
    return SimpleNamespace(name="coordinator-0", runtime=runtime)


def _told(world: World, instance: SimpleNamespace, member_id: str, epoch: int,
          partitions: tuple[int, ...] | None) -> None:
    from coordinator.group.modern.heartbeat import HeartbeatResponse as ConsumerHeartbeatResponse
    from simulator.consumer_protocol import topic_id

    pending = Pending(0, "consumer_group_heartbeat", GROUP, member_id, "c", 0, None)  # type: ignore[arg-type]
    assignment = None if partitions is None else {topic_id("t"): partitions}
    world.checkers.consumer_heartbeat_answered(instance, pending, ConsumerHeartbeatResponse(
        member_id=member_id, member_epoch=epoch, assignment=assignment))


def test_consumer_owner_fails_when_a_partition_goes_to_a_member_before_its_owner_revoked_it() -> None:
    world = World()
    world.checkers.claim(GROUP, "consumer-a", "a", frozenset({("t", 0), ("t", 1)}))
    # the coordinator no longer counts 1 as a's, but a still owns it: it never acknowledged the revocation
    _told(world, _consumer_instance({"a": {0: (0,)}, "b": {0: (1,)}}), "b", 2, (1,))
    assert world.invariants() == {"consumer_owner"}


def test_consumer_owner_holds_once_the_owner_revoked_or_was_fenced() -> None:
    world = World()
    world.checkers.claim(GROUP, "consumer-a", "a", frozenset({("t", 0)}))  # revoked 1 before acknowledging
    world.checkers.claim(GROUP, "consumer-z", "z", frozenset({("t", 2)}))  # a zombie: fenced, not a member
    _told(world, _consumer_instance({"a": {0: (0,)}, "b": {0: (1, 2)}}), "b", 2, (1, 2))
    assert world.invariants() == set()


def test_consumer_owner_fails_when_two_members_hold_a_partition_in_the_coordinators_group() -> None:
    world = World()
    _told(world, _consumer_instance({"a": {0: (0,)}, "b": {0: (1,)}}, pending={"a": {0: (1,)}}), "a", 1, None)
    assert world.invariants() == {"consumer_owner"}


@pytest.mark.parametrize("told, broken", [
    ([(3, (0, 1)), (2, (0, 1))], True),  # the epoch went back
    ([(3, (0, 1)), (3, (0,)), (3, (0, 2))], True),  # lost 1, then gained 2, in epoch 3
    ([(3, (0,)), (3, (0, 1)), (3, (0,)), (4, (0, 2))], False),  # released partitions come, revocations, next epoch
    ([(3, (0, 1)), (3, None), (4, None)], False),  # unchanged assignments
])
def test_member_epoch_fails_when_an_epoch_goes_back_or_gains_after_a_loss(told: list, broken: bool) -> None:
    world = World()
    instance = _consumer_instance({"a": {}})
    for epoch, partitions in told:
        _told(world, instance, "a", epoch, partitions)
    assert world.invariants() == ({"member_epoch"} if broken else set())


@pytest.mark.parametrize("between, broken", [
    (None, True),
    ("classic", False),  # the Empty consumer group was deleted for a classic group, later upgraded (seeds 967, 1086)
    ("consumer", False),  # an Empty classic group gave way to a new consumer group
    ("deleted", False),  # the group was deleted (DeleteGroups, retired with its offsets) and made again (seed 760)
])
def test_member_epoch_starts_again_when_the_consumer_group_is_replaced_or_deleted(between: str | None,
                                                                                  broken: bool) -> None:
    """A consumer group replaced by a classic group is deleted (Kafka's maybeDeleteEmptyConsumerGroup); the
    consumer group an upgrade makes of that classic group later takes its epochs from the classic generation
    (ConsumerGroup.fromClassicGroup): the same member id may then be told a lower epoch, in a new life."""
    world = World()
    instance = _consumer_instance({"a": {}})
    _told(world, instance, "a", 6, (0,))
    if between == "deleted":
        world.checkers.group_deleted(GROUP)
    elif between is not None:
        world.history.record("replaced", inst=0, group=GROUP, to=between)
    _told(world, instance, "a", 2, (0,))
    assert world.invariants() == ({"member_epoch"} if broken else set())


@pytest.mark.parametrize("made_in_consumer_group", [True, False])
def test_a_sync_a_consumer_group_made_is_judged_as_its_answer_after_a_downgrade(made_in_consumer_group: bool
                                                                               ) -> None:
    """A classic member's SyncGroup made by a consumer group at 1 s goes out at 5 s, once the group's earlier
    writes are acknowledged; the group turned classic meanwhile (seed 1394 of --protocol upgrade). It is the
    consumer group's answer: no classic group record to wait for (answer_after_ack), and the session was reset
    when it was made, so the classic group's session armed at the downgrade may end 10 s after 1 s
    (session_expiry). Judged by the group's type when answered instead, both fail."""
    world = World()
    instance = _consumer_instance({"a": {}})
    instance.runtime.partition_for = lambda _group: 0
    groups = instance.runtime.shard_for(GROUP).consumer_groups
    response = SimpleNamespace(error_code=Errors.NONE, assignment=None)
    world.now = 1_000
    if made_in_consumer_group:
        world.checkers.synced_in_consumer_group(response, groups[GROUP])
    groups.clear()  # downgraded while the answer waited
    world.now = 5_000
    pending = Pending(0, "sync_group", GROUP, "a", "c", 1_000, None, generation=3)  # type: ignore[arg-type]
    world.checkers.answered(instance, pending, response)  # type: ignore[arg-type]
    world.now = 11_000
    world.history.record("expired", inst=0, group=GROUP, member="a", session_ms=10_000)
    assert world.invariants() == (set() if made_in_consumer_group else {"answer_after_ack", "session_expiry"})


@pytest.mark.parametrize("fenced_at_ms, broken", [(9_999, True), (10_000, False)])
def test_consumer_session_expiry_fails_before_the_session_passed(fenced_at_ms: int, broken: bool) -> None:
    world = World()
    world.now = 5_000
    world.checkers.consumer_session_restarted("coordinator-0", GROUP, ["a"])
    world.now = 5_000 + fenced_at_ms
    world.checkers.consumer_session_expired("coordinator-0", GROUP, "a", 10_000)
    assert world.invariants() == ({"session_expiry"} if broken else set())


# --- txn_offsets ------------------------------------------------------------------------------------------------
TXN_GROUP = "txn-group-0"
TXN_KEY = (TXN_GROUP, "t", 0)


def _txn_violations(steps: list[tuple[str, object]]) -> list[str]:
    """A transactional application's history: ("landed", (offset, txn number)), ("ended", (txn number, commit)),
    ("answered", offset) for a TxnOffsetCommit answered NONE, ("tombstone", None) for one of our tombstones of
    the partition issued (a DeleteGroups, say), ("fetched", (offset, error, stable))."""
    world = World()
    for step, arg in steps:
        world.now += 10
        if step == "landed":
            offset, number = arg  # type: ignore[misc]
            world.checkers.txn_offset_landed(TXN_GROUP, TP, offset, ("app", number))
        elif step == "ended":
            number, commit = arg  # type: ignore[misc]
            world.checkers.txn_ended("app", number, commit)
        elif step == "answered":
            world.checkers.txn_offsets_pending(TXN_GROUP, {TP: arg}, "app")  # type: ignore[dict-item]
        elif step == "tombstone":
            world.ledger.issued("p", 0, [(0, encode_key(OffsetCommitKey(TXN_GROUP, *TP)), None)])
        else:
            offset, error, stable = arg  # type: ignore[misc]
            world.checkers.txn_fetched(TXN_GROUP, TP, offset, error, stable, world.now - 5, "app")
    return [v.invariant for v in world.checkers.violations]


@pytest.mark.parametrize("steps,broken", [
    ([("landed", (1, 1)), ("answered", 1), ("ended", (1, True)), ("fetched", (1, Errors.NONE, True))], False),
    # visible before its marker, or after an abort
    ([("landed", (1, 1)), ("fetched", (1, Errors.NONE, False))], True),
    ([("landed", (1, 1)), ("ended", (1, False)), ("fetched", (1, Errors.NONE, False))], True),
    # pending: a stable fetch must be UNSTABLE_OFFSET_COMMIT
    ([("landed", (1, 1)), ("answered", 1), ("fetched", (-1, Errors.UNSTABLE_OFFSET_COMMIT, True))], False),
    ([("landed", (1, 1)), ("answered", 1), ("fetched", (-1, Errors.NONE, True))], True),
    # a tombstone of ours issued once the batch landed drops the pending offset, also one issued before the answer
    # reached the client (seed 11837: a DeleteGroups handled meanwhile); one issued before the batch landed does not
    ([("landed", (1, 1)), ("answered", 1), ("tombstone", None), ("fetched", (-1, Errors.NONE, True))], False),
    ([("landed", (1, 1)), ("tombstone", None), ("answered", 1), ("fetched", (-1, Errors.NONE, True))], False),
    ([("tombstone", None), ("landed", (1, 1)), ("answered", 1), ("fetched", (-1, Errors.NONE, True))], True),
    # committed, then lost or regressed
    ([("landed", (1, 1)), ("ended", (1, True)), ("landed", (2, 2)), ("ended", (2, True)),
      ("fetched", (1, Errors.NONE, True))], True),
    ([("landed", (1, 1)), ("ended", (1, True)), ("fetched", (-1, Errors.NONE, True))], True),
    # answered NONE without its batch in the log
    ([("answered", 3)], True),
])
def test_txn_offsets(steps: list[tuple[str, object]], broken: bool) -> None:
    assert bool(_txn_violations(steps)) == broken
    assert set(_txn_violations(steps)) <= {"txn_offsets"}


# --- txn_verification -------------------------------------------------------------------------------------------
_ONGOING = Described("Ongoing", 7, 3, frozenset({0}))


@pytest.mark.parametrize("version,outcomes,answer,broken", [
    # the transaction coordinator refused: its error, never the group's
    (4, [Described("Ongoing", 7, 4, frozenset({0}))], Errors.INVALID_PRODUCER_EPOCH, False),
    (4, [Described("Ongoing", 7, 4, frozenset({0}))], Errors.UNKNOWN_MEMBER_ID, True),
    (5, [None], Errors.INVALID_PRODUCER_ID_MAPPING, False),
    (5, [Described("Ongoing", 8, 3, frozenset({0}))], Errors.ILLEGAL_GENERATION, True),
    (3, [Described("PrepareAbort", 7, 3, frozenset({0}))], Errors.CONCURRENT_TRANSACTIONS, False),
    (3, [Described("CompleteCommit", 7, 3, frozenset())], Errors.INVALID_TXN_STATE, False),
    (4, [Described("CompleteCommit", 7, 3, frozenset())], Errors.TRANSACTION_ABORTABLE, False),
    (4, [Described("CompleteCommit", 7, 3, frozenset())], Errors.UNKNOWN_MEMBER_ID, True),
    # verified: the group's refusal; v5 adds the partition itself
    (4, [_ONGOING], Errors.UNKNOWN_MEMBER_ID, False),
    (5, [Described("CompleteAbort", 7, 3, frozenset())], Errors.ILLEGAL_GENERATION, False),
    (4, [_ONGOING], Errors.INVALID_PRODUCER_EPOCH, True),
    # not verified (its coordinator's errors, no answer): the client retries
    (4, [Errors.COORDINATOR_LOAD_IN_PROGRESS], Errors.COORDINATOR_NOT_AVAILABLE, False),
    (4, [Errors.REQUEST_TIMED_OUT], Errors.UNKNOWN_MEMBER_ID, True),
    # refused by the group without asking
    (4, [], Errors.UNKNOWN_MEMBER_ID, True),
    (4, [], Errors.NOT_COORDINATOR, False),
])
def test_txn_verification(version: int, outcomes: list, answer: Errors, broken: bool) -> None:
    world = World()
    world.checkers.txn_refused("zombie", "app", 7, 3, version, 0, {answer}, outcomes)
    assert world.invariants() == ({"txn_verification"} if broken else set())
