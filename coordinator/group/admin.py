"""DescribeGroups (§3.7), ListGroups (§3.8), DeleteGroups (§3.9), per shard (the runtime fans a request out
over the shards of its groups and puts the answers back in request order)."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from coordinator.group.api import DescribedGroup, DescribedGroupMember, ListedGroup, ListGroupsRequest
from coordinator.group.modern.conversion import consumer_group_tombstones
from coordinator.group.modern.deletion import delete_error
from coordinator.group.modern.group import ConsumerGroup
from coordinator.group.offsets import (GroupSelector, Removal, cleanup_groups, remove_with_pending,
                                       unwritten_tombstones)
from coordinator.group.records import Record
from coordinator.group.result import Result, Write
from protocol.error_codes import Errors
from coordinator.group.state import GroupState

if TYPE_CHECKING:
    from coordinator.group.shard import GroupShard
    from coordinator.group.metadata import GroupMetadata

log = logging.getLogger("coordinator.group")

CLASSIC = "classic"
CONSUMER = "consumer"


def describe_group(shard: GroupShard, group_id: str, version: int = 5) -> DescribedGroup:
    error = shard.group_status_error(group_id, empty_id_ok=True)
    if error is not None:
        return DescribedGroup(error, group_id)
    group = shard.groups.get(group_id)
    if group is None or group_id in shard.consumer_groups:
        # v6 (Kafka 4.0, KIP-1043) reports the unknown group; older versions describe it as Dead. A consumer
        # group (KIP-848) is not a classic group: Kafka answers the same (ConsumerGroupDescribe describes it).
        error = Errors.GROUP_ID_NOT_FOUND if version >= 6 else Errors.NONE
        return DescribedGroup(error, group_id, group_state=GroupState.DEAD.value)
    return _summary(group)


def _summary(group: GroupMetadata) -> DescribedGroup:
    stable = group.is_in(GroupState.STABLE)
    protocol = group.protocol_name if stable else None
    members = [
        DescribedGroupMember(
            m.member_id, m.group_instance_id, m.client_id, m.client_host,
            m.metadata(protocol) if protocol is not None else b"",
            m.assignment if stable else b"")
        for m in group.members.values()
    ]
    return DescribedGroup(Errors.NONE, group.group_id, group.state.value, group.protocol_type or "",
                          protocol or "", members)


def list_groups(shard: GroupShard, req: ListGroupsRequest) -> list[ListedGroup]:
    """This shard's groups that pass the request's filters: classic ones, and consumer groups (KIP-848: protocol
    type and group type "consumer"). The classic record that only keeps a consumer group's offsets is not a group
    of its own."""
    states = {s.lower() for s in req.states_filter}
    types = {t.lower() for t in req.types_filter}
    listed = []
    if not types or CLASSIC in types:
        listed += [ListedGroup(g.group_id, g.protocol_type or "", g.state.value, CLASSIC)
                   for g in shard.groups.values()
                   if g.group_id not in shard.consumer_groups and (not states or g.state.lower_name in states)]
    if not types or CONSUMER in types:
        listed += [ListedGroup(g.group_id, ConsumerGroup.protocol_type, g.state.value, CONSUMER)
                   for g in shard.consumer_groups.values() if not states or g.state.value.lower() in states]
    return listed


@dataclass(slots=True)
class Deletions:
    """A shard's DeleteGroups answer: the error per group, and the groups whose answer waits for an earlier
    deletion's write not answered yet (GROUP_ID_NOT_FOUND once it is written, else its error)."""

    results: dict[str, Errors]
    waiting: dict[str, Write]


def handle_delete_groups(shard: GroupShard, group_ids: list[str]) -> Result[Deletions]:
    """Deletes the Empty groups among `group_ids` (all of this shard): the error per group, answered once
    their tombstones are written. A tombstone that fails is kept owed by the store and sent again.

    A group already deleted whose tombstones (its offsets', its own records') are not acknowledged yet is deleted
    again: they are written again and the group is answered by that write. Kafka's memory reverts a failed
    deletion (CoordinatorRuntime.failCurrentBatch: revertLastWrittenOffset), so there the group is still Empty
    and the next DeleteGroups writes its tombstones again (GroupCoordinatorShard.deleteGroups); ours forgot the
    group at the first attempt, and answering GROUP_ID_NOT_FOUND would report deleted a group that a restart
    before the owed retry lands brings back.

    A group whose deletion's write is still unanswered (sent, neither acknowledged nor failed) is not written again:
    its answer waits for that write (`Deletions.waiting`). Kafka validates against its latest, uncommitted state
    (the group is gone: GROUP_ID_NOT_FOUND) and a write with no records waits for the pending one
    (CoordinatorRuntime: deferred until the last written offset is committed, failed with that write's error)."""
    results: dict[str, Errors] = {}
    waiting: dict[str, Write] = {}
    eligible: list[GroupMetadata] = []
    again: list[Write] = []
    consumer_writes: list[Write] = []
    for group_id in group_ids:
        error = shard.group_status_error(group_id, empty_id_ok=True)
        group = shard.groups.get(group_id)
        if error is not None:
            results[group_id] = error
        elif group_id in shard.consumer_groups:
            results[group_id] = _delete_consumer_group(shard, group_id, consumer_writes)
        elif group is None or group.is_in(GroupState.DEAD):
            unanswered = shard.deletions_unanswered.get(group_id)
            if unanswered is not None:
                results[group_id] = Errors.GROUP_ID_NOT_FOUND
                waiting[group_id] = unanswered
            else:
                results[group_id] = _delete_again(shard, group_id, again)
        elif group.is_in(GroupState.EMPTY):
            group.transition_to(GroupState.DEAD, shard.now_wall_ms())
            eligible.append(group)
            results[group_id] = Errors.NONE
        else:
            results[group_id] = Errors.NON_EMPTY_GROUP
    writes: list[Write] = []
    if eligible:
        removed, writes = cleanup_groups(shard, eligible, _every_offset(shard), Removal.GROUP_DELETED)
        _with_owed_group_tombstones(shard, eligible, writes)
        log.info("event=groups_deleted groups=%s offsets_removed=%d", [g.group_id for g in eligible], removed)
    deletions = consumer_writes + again + writes
    for write in deletions:
        _unanswered_until_answered(shard, write)
    return Result(Deletions(results, waiting), deletions)


def _unanswered_until_answered(shard: GroupShard, write: Write) -> None:
    """The group's deletion write is the one a DeleteGroups of it waits for until it is answered."""
    group_id, records = write.group_id, write.records  # not the write itself: no cycle through its `then`
    shard.deletions_unanswered[group_id] = write

    def answered(_: Errors) -> None:
        unanswered = shard.deletions_unanswered.get(group_id)
        if unanswered is not None and unanswered.records is records:
            del shard.deletions_unanswered[group_id]

    write.then_also(answered)


def _delete_again(shard: GroupShard, group_id: str, writes: list[Write]) -> Errors:
    """A group not in memory: GROUP_ID_NOT_FOUND, unless an earlier deletion's tombstones of it (its offsets', its
    own records') are not acknowledged yet; then they go again, the offsets' first as Kafka orders a deletion (NONE,
    or the write's error once it fails)."""
    offsets = [r for w in unwritten_tombstones(shard, group_id) for r in w.records]
    own = shard.unwritten_group_tombstones(group_id)
    if not offsets and not own:
        return Errors.GROUP_ID_NOT_FOUND
    log.info("event=group_deleted_again group=%s offsets=%d group_records=%d", group_id, len(offsets), len(own))

    def written(error: Errors) -> None:
        if error != Errors.NONE:  # still owed: the store sends them again
            log.warning("event=tombstone_write_failed group=%s offsets=%d group_records=%d error=%s", group_id,
                        len(offsets), len(own), error.name)

    writes.append(Write(group_id, [*offsets, *own], written))
    return Errors.NONE


def _with_owed_group_tombstones(shard: GroupShard, deleted: list[GroupMetadata], writes: list[Write]) -> None:
    """A deleted group whose own records' earlier tombstones are still owed (a simple consumer's commit made the
    group again, with no generation of its own to write a metadata tombstone for) writes them again too."""
    by_group = {write.group_id: write for write in writes}
    for group in deleted:
        owed = shard.unwritten_group_tombstones(group.group_id)
        if not owed:
            continue
        write = by_group.get(group.group_id)
        if write is None:
            writes.append(Write(group.group_id, owed))
        else:
            write.records.extend(r for r in owed if r not in write.records)


def _every_offset(shard: GroupShard) -> GroupSelector:
    """A deleted group's offsets: every one the log may hold (committed, in flight, possibly written) and those
    of transactions still open."""
    return lambda g: remove_with_pending(shard, g, [*g.partitions_in_log(),
                                                    *shard.transactional_offsets.pending_partitions(g.group_id),
                                                    *sorted(shard.unwritten_tombstones(g.group_id))])


def _delete_consumer_group(shard: GroupShard, group_id: str, writes: list[Write]) -> Errors:
    """An Empty consumer group goes with its offsets: one write of the offsets' tombstones, then the group's
    (Kafka's GroupCoordinatorShard.deleteGroups order), replayed at once so the next request sees no group."""
    group = shard.consumer_groups[group_id]
    error = delete_error(group)
    if error is not None:
        return error
    offsets_holder = shard.groups.get(group_id)
    records: list[Record] = []
    if offsets_holder is not None:
        _, offset_writes = cleanup_groups(shard, [offsets_holder], _every_offset(shard), Removal.GROUP_DELETED)
        records = [r for w in offset_writes for r in w.records]
    else:  # offsets deleted before whose tombstones are not acknowledged yet go again with the group's
        records = [r for w in unwritten_tombstones(shard, group_id) for r in w.records]
        shard.observer.on_group_deleted(group_id, 0)
    tombstones = consumer_group_tombstones(group)
    for tombstone in tombstones:
        group.replay(tombstone)
    del shard.consumer_groups[group_id]
    shard.consumer_group_deleted(group_id)  # a write of it still unanswered must not bring it back if it fails
    log.info("event=consumer_group_deleted group=%s offsets_removed=%d", group_id, len(records))

    def written(append_error: Errors) -> None:
        if append_error != Errors.NONE:  # the store keeps them owed and sends them again
            log.warning("event=tombstone_write_failed group=%s error=%s", group_id, append_error.name)

    writes.append(Write(group_id, [*records, *tombstones], written))
    return Errors.NONE
