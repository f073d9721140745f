"""A static replacement's revert held by the later writes of its group that carry its new member id (§4.7).

Kafka reverts a static replacement whose group record failed as soon as the append fails (3.9
`updateStaticMemberAndRebalance`, 4.x GroupMetadataManager's append future). Its appends are to the local log:
one refused fails with its batch (`failCurrentBatch`) before any later write of the partition is made, so no later
record carries the id being reverted. Ours go over the network and fail out of order: when the replacement's write
fails (or times out, landed or not), a later write of the group made meanwhile — another static member's
replacement — may carry the new id and still be acknowledged. Reverting then leaves memory in a state no record
holds (the old id beside the later write's changes), and the acknowledged later record puts the new id in the log
all the same. (Kafka has the same gap for a timed-out append: its `OperationTimeout` fails the write, the revert
runs, and a later append of the partition may still commit with the id.)

So the revert is held by every later write of the group whose record carries the new id, as a superseded
tombstone is held by the later writes of its key (coordinator/storage/tombstones.py): one of them acknowledged,
the id is stored and the replacement stands; all of them failed, none of their records is known to be in the log
and the replacement is reverted then, as Kafka reverts it. Memory meanwhile is what the latest of them carries.

The group's conversion to a consumer group (KIP-848 online upgrade, modern/service.py `_upgrade`) is such a later
write: its records carry every member's id. Kafka's conversion leaves the classic group object in place if its
write fails, and the replacement's append future reverts that very object; ours puts a new classic group back,
made of the record the conversion replaced, so the undecided holds move to it (`move_holds`) and the replacement
is decided against the group that holds it now (`holding_group`).
"""
from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING, Callable

from protocol.error_codes import Errors

if TYPE_CHECKING:
    from coordinator.group.metadata import GroupMetadata
    from coordinator.group.records import GroupRecord
    from coordinator.group.result import Write


class ReplacementHold:
    """The replacement of one static member to `member_id`, its write not decided yet: `pending` later writes
    carrying the id are unanswered, `written` once one of them was acknowledged; `failed_with` once the
    replacement's own write failed while some were unanswered, and `on_settled` decides it when they are."""

    __slots__ = ("member_id", "pending", "written", "failed_with", "on_settled")

    def __init__(self, member_id: str) -> None:
        self.member_id = member_id
        self.pending = 0
        self.written = False
        self.failed_with: Errors | None = None
        self.on_settled: Callable[[], None] | None = None

    @property
    def undecided(self) -> bool:
        """The replacement's outcome still waits for later writes: none acknowledged, some unanswered."""
        return not self.written and self.pending > 0

    def settle(self, error: Errors) -> None:
        """One later write carrying the id was answered (`error`: Kafka's, NONE if acknowledged)."""
        self.pending -= 1
        if error == Errors.NONE:
            self.written = True
        if self.failed_with is not None and self.on_settled is not None and not self.undecided:
            decide, self.on_settled = self.on_settled, None
            decide()


def open_hold(group: GroupMetadata, member_id: str) -> ReplacementHold:
    hold = ReplacementHold(member_id)
    if group.replacement_holds is None:
        group.replacement_holds = [hold]
    else:
        group.replacement_holds.append(hold)
    return hold


def close_hold(group: GroupMetadata, hold: ReplacementHold) -> None:
    holds = group.replacement_holds
    if holds is not None and hold in holds:
        holds.remove(hold)
        if not holds:
            group.replacement_holds = None
    hold.on_settled = None  # it refers to the join's decision, which refers to the hold: no cycle left behind


def held_by(group: GroupMetadata, record: GroupRecord, write: Write) -> None:
    """`write` (of `record`) holds every open replacement whose new id the record carries."""
    if group.replacement_holds:
        held_by_members(group, {member.member_id for member in record.members}, write)


def held_by_members(group: GroupMetadata, carried: Collection[str], write: Write) -> None:
    """`write`, whose records carry the member ids `carried`, holds every open replacement to one of them (call it
    once the write's own `then` is set: its settling runs after that)."""
    for hold in group.replacement_holds or ():
        if hold.member_id in carried:
            hold.pending += 1
            write.then_also(hold.settle)


def move_holds(old: GroupMetadata, new: GroupMetadata) -> None:
    """`new` takes `old`'s place in its shard (a failed conversion put it back): the replacements still open are
    decided against it."""
    if old.replacement_holds:
        new.replacement_holds = [*(new.replacement_holds or ()), *old.replacement_holds]
    old.replacement_holds = None


def holding_group(groups: Mapping[str, GroupMetadata], group: GroupMetadata, hold: ReplacementHold
                  ) -> GroupMetadata:
    """The group `hold` is decided against: the shard's group of that id if its holds were moved there, else
    `group`, the one the replacement was made in."""
    current = groups.get(group.group_id)
    if current is not None and current is not group and hold in (current.replacement_holds or ()):
        return current
    return group
