"""Loading replays a group's records: the one place a record becomes in-memory state."""
from __future__ import annotations

from coordinator.group.loading import materialize_group
from coordinator.group.observer import GroupObserver
from coordinator.group.records import GroupMetadataRecord, GroupRecord, MemberRecord, OffsetCommitRecord, OffsetRecord
from coordinator.group.state import GroupState


def member(member_id: str) -> MemberRecord:
    return MemberRecord(member_id, None, "client", "/127.0.0.1", 30_000, 10_000, b"sub", b"assignment")


def test_records_replay_in_order_and_tombstones_delete_what_came_before() -> None:
    group = materialize_group("g", [
        GroupMetadataRecord("g", GroupRecord("consumer", 3, "range", "m1", 1_000, [member("m1")])),
        OffsetCommitRecord("g", "t", 0, OffsetRecord(5)),
        OffsetCommitRecord("g", "t", 1, OffsetRecord(6)),
        OffsetCommitRecord("g", "t", 0, None),
        OffsetCommitRecord("g", "t", 1, OffsetRecord(7)),
    ], 2_000, GroupObserver())
    assert group.state is GroupState.STABLE and group.generation_id == 3 and list(group.members) == ["m1"]
    assert group.members["m1"].assignment == b"assignment"
    assert {tp: r.offset for tp, r in group.offsets.items()} == {("t", 1): 7}


def test_a_deleted_group_record_leaves_an_empty_group_with_its_offsets() -> None:
    group = materialize_group("g", [
        GroupMetadataRecord("g", GroupRecord("consumer", 3, "range", "m1", 1_000, [member("m1")])),
        OffsetCommitRecord("g", "t", 0, OffsetRecord(5)),
        GroupMetadataRecord("g", None),
    ], 2_000, GroupObserver())
    assert group.state is GroupState.EMPTY and group.generation_id == 0 and not group.members
    assert {tp: r.offset for tp, r in group.offsets.items()} == {("t", 0): 5}
