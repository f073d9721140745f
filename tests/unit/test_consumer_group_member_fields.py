"""A member's record-8 changes (`with_epoch`, `moved_to`, `with_assignment`) are made without dataclasses.replace
(once per reconciling heartbeat and per replayed record 8): each still carries every other field of the member
as `replace` does, whatever fields the member gets later."""

from __future__ import annotations

import dataclasses
import uuid

from coordinator.group.modern.member import ConsumerGroupMember, MemberState
from coordinator.group.modern.records import ClassicMemberMetadata, CurrentAssignmentRecord

TOPIC = uuid.UUID(int=7)
RECORD_8 = {"member_epoch", "previous_member_epoch", "state", "assigned", "pending_revocation"}


def _every_field_set() -> ConsumerGroupMember:
    """A member whose every field differs from its default (a field a change forgot would show)."""
    member = ConsumerGroupMember(
        "m-1", member_epoch=5, previous_member_epoch=4, state=MemberState.UNRELEASED_PARTITIONS, instance_id="i-1",
        rack_id="r-1", rebalance_timeout_ms=45_000, client_id="c-1", client_host="/10.0.0.1",
        subscribed_topic_names=("a", "b"), subscribed_topic_regex="a.*", server_assignor="range",
        assigned={TOPIC: (1, 2)}, pending_revocation={TOPIC: (3,)}, classic=ClassicMemberMetadata(30_000, ()))
    defaults = ConsumerGroupMember("")
    assert all(getattr(member, f.name) != getattr(defaults, f.name) for f in dataclasses.fields(member))
    return member


def test_with_epoch_is_replace() -> None:
    member = _every_field_set()
    assert member.with_epoch(9) == dataclasses.replace(member, member_epoch=9, previous_member_epoch=5)


def test_moved_to_is_with_epoch_then_replace() -> None:
    member = _every_field_set()
    moved = member.moved_to(9, MemberState.STABLE, {TOPIC: (1,)}, {})
    assert moved == dataclasses.replace(member.with_epoch(9), state=MemberState.STABLE, assigned={TOPIC: (1,)},
                                        pending_revocation={})
    for f in dataclasses.fields(member):
        if f.name not in RECORD_8:
            assert getattr(moved, f.name) == getattr(member, f.name), f.name


def test_with_assignment_takes_record_8_and_keeps_the_rest() -> None:
    member = _every_field_set()
    record = CurrentAssignmentRecord("g", "m-1", 11, 10, int(MemberState.UNREVOKED_PARTITIONS), {TOPIC: (2,)},
                                     {TOPIC: (1,)})
    assert member.with_assignment(record) == dataclasses.replace(
        member, member_epoch=11, previous_member_epoch=10, state=MemberState.UNREVOKED_PARTITIONS,
        assigned={TOPIC: (2,)}, pending_revocation={TOPIC: (1,)})
