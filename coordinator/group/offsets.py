"""OffsetCommit (§3.5), OffsetFetch (§3.6), OffsetDelete and offset expiry (§7.3), as functions of a shard.
Commits and deletions return their records; the runtime answers once they are written."""
from __future__ import annotations

import logging
from enum import Enum
from collections.abc import Iterator
from typing import TYPE_CHECKING, Callable

from coordinator.group.api import (UNKNOWN_MEMBER_ID, OffsetCommitRequest, OffsetCommitResponse,
                                   OffsetCommitResponsePartition, OffsetCommitResponseTopic, OffsetDeleteRequest,
                                   OffsetDeleteResponse, OffsetDeleteResponsePartition, OffsetDeleteResponseTopic,
                                   OffsetFetchRequest, OffsetFetchResponse, OffsetFetchResponsePartition,
                                   OffsetFetchResponseTopic)
from coordinator.group.delayed import member_key
from coordinator.group.errors import kafka4_append_error, offset_append_error
from protocol.error_codes import Errors
from coordinator.group.metadata import CONSUMER_PROTOCOL_TYPE, GroupMetadata
from coordinator.group.modern.offsets import validate_offset_commit, validate_offset_fetch
from coordinator.group.observer import GroupObserver
from coordinator.group.state import COMPLETING, DEAD, EMPTY, PREPARING, STABLE
from coordinator.group.records import OffsetCommitRecord, OffsetRecord, TopicPartition
from coordinator.group.result import Result, Write
from coordinator.group.status import ShardStatus

if TYPE_CHECKING:
    from coordinator.group.shard import GroupShard

GroupSelector = Callable[[GroupMetadata], list[TopicPartition]]


class Removal(Enum):
    """Why offsets are removed, which says what observers are told."""

    EXPIRED = "expired"  # the retention check
    DELETED = "deleted"  # OffsetDelete
    GROUP_DELETED = "group_deleted"  # DeleteGroups


def _announce(observer: GroupObserver, removal: Removal, group_id: str, count: int) -> None:
    if removal is Removal.GROUP_DELETED:
        observer.on_group_deleted(group_id, count)
    elif removal is Removal.DELETED:
        observer.on_offsets_deleted(group_id, count)
    else:
        observer.on_offsets_expired(group_id, count)

log = logging.getLogger("coordinator.group")
EXPIRY_SLICE = 256  # groups the offset cleanup visits per loop callback (~2 ms of CPU)


def _commit_response(req: OffsetCommitRequest, errors: dict[TopicPartition, Errors] | Errors) -> OffsetCommitResponse:
    """Per-partition errors in the request's order, each partition once (Kafka keys them by TopicPartition);
    a single error applies to every partition."""
    by_topic: dict[str, dict[int, Errors]] = {}
    for t in req.topics:
        partitions = by_topic.setdefault(t.name, {})
        for p in t.partitions:
            tp = (t.name, p.partition_index)
            partitions[p.partition_index] = errors if isinstance(errors, Errors) else errors[tp]
    return OffsetCommitResponse([
        OffsetCommitResponseTopic(name, [OffsetCommitResponsePartition(i, error) for i, error in parts.items()])
        for name, parts in by_topic.items()
    ])


def java_length(text: str) -> int:
    """Java's String.length(): UTF-16 code units, so a character outside the BMP counts twice."""
    return len(text) if text.isascii() else len(text.encode("utf-16-le")) // 2


# --- OffsetCommit -----------------------------------------------------------------------------------------
def handle_commit_offsets(shard: GroupShard, req: OffsetCommitRequest) -> Result[OffsetCommitResponse]:
    """The offsets to append and, once they are acknowledged, the per-partition answer."""
    error = shard.group_status_error(req.group_id, empty_id_ok=True)
    if error is not None:
        return Result(_commit_response(req, error))
    consumer_group = shard.consumer_groups.get(req.group_id)
    if consumer_group is not None:  # KIP-848: member epochs; the offsets live beside the classic ones
        error = validate_offset_commit(consumer_group, req.member_id, req.generation_id, req.version)
        if error is not None:
            return Result(_commit_response(req, error))
        return _commit(shard, shard.add_group(req.group_id), req)
    group = shard.groups.get(req.group_id)
    if group is None:
        if req.generation_id >= 0:  # a commit from an older generation, or a deleted group
            return Result(_commit_response(req, Errors.ILLEGAL_GENERATION))
        group = shard.add_group(req.group_id)  # a "simple" consumer using Kafka for offsets only
    error = _validate_offset_commit(shard, group, req)
    if error is None and group.is_in(COMPLETING):
        error = Errors.REBALANCE_IN_PROGRESS
    if error is not None:
        return Result(_commit_response(req, error))
    if group.state in (STABLE, PREPARING):
        member = group.get(req.member_id)
        shard.schedule_heartbeat(group, member, member.session_timeout_ms)
    return _commit(shard, group, req)


def _commit(shard: GroupShard, group: GroupMetadata, req: OffsetCommitRequest) -> Result[OffsetCommitResponse]:
    errors, offsets = _offset_records(shard, req)
    if not offsets:
        return Result(_commit_response(req, errors))  # every partition's metadata was too large: answer at once

    def respond(append_errors: list[Errors]) -> OffsetCommitResponse:
        errors.update(dict.fromkeys(offsets, offset_append_error(append_errors[0])))
        return _commit_response(req, errors)

    return Result(None, [_offset_write(shard, group, req.member_id, offsets)], respond)


def _validate_offset_commit(shard: GroupShard, group: GroupMetadata, req: OffsetCommitRequest
                            ) -> Errors | None:
    return validate_commit_member(shard, group, req.generation_id, req.member_id, req.group_instance_id,
                                  "offset-commit", without_member=Errors.UNKNOWN_MEMBER_ID)


def validate_commit_member(shard: GroupShard, group: GroupMetadata, generation_id: int, member_id: str,
                           group_instance_id: str | None, operation: str, *, without_member: Errors | None
                           ) -> Errors | None:
    """A classic group's check of an offset commit's member and generation (ClassicGroup.validateOffsetCommit);
    `without_member`: the answer to generation -1 without a member in a group that is not Empty (OffsetCommit
    refuses it, TxnOffsetCommit of old versions, which carry no member, does not)."""
    if group.is_in(DEAD):
        return Errors.COORDINATOR_NOT_AVAILABLE
    if generation_id < 0 and group.is_in(EMPTY):
        return None
    if generation_id >= 0 or member_id != UNKNOWN_MEMBER_ID or group_instance_id is not None:
        error = shard.validate_current_member(group, member_id, group_instance_id, operation)
        if error is None and generation_id != group.generation_id:
            error = Errors.ILLEGAL_GENERATION
        return error
    return without_member


def _offset_write(shard: GroupShard, group: GroupMetadata, member_id: str,
                  offsets: dict[TopicPartition, OffsetRecord]) -> Write:
    """The cache takes the offsets only once they are written, and only if no newer commit of the same
    partition was written first (writes are acknowledged in order, but a failed one must not win)."""
    version = shard.next_offset_write_seq()
    group.prepare_offset_commit(list(offsets))

    def written(append_error: Errors) -> None:
        holder = group.offsets_holder()  # the group id may have changed type meanwhile (an online upgrade)
        holder.finish_offset_commit(offsets, version, ok=append_error == Errors.NONE and not holder.is_in(DEAD))
        if append_error == Errors.NONE:
            shard.observer.on_offsets_committed(group.group_id, member_id, len(offsets))
        else:
            log.warning("event=offset_commit_failed group=%s member=%s partitions=%d error=%s",
                        group.group_id, member_id, len(offsets), offset_append_error(append_error).name)

    return Write.offset_commit(group.group_id, offsets, written)


def _offset_records(shard: GroupShard, req: OffsetCommitRequest
                    ) -> tuple[dict[TopicPartition, Errors], dict[TopicPartition, OffsetRecord]]:
    now_ms = shard.now_wall_ms()
    expire_ms = now_ms + req.retention_time_ms if req.retention_time_ms != -1 else None
    errors: dict[TopicPartition, Errors] = {}
    offsets: dict[TopicPartition, OffsetRecord] = {}
    latest = {(topic.name, p.partition_index): p for topic in req.topics for p in topic.partitions}
    for tp, p in latest.items():  # a partition given twice: the last one counts, as in Kafka's map
        metadata = p.committed_metadata or ""
        if java_length(metadata) > shard.config.offset_metadata_max_bytes:
            errors[tp] = Errors.OFFSET_METADATA_TOO_LARGE
            continue
        commit_ms = p.commit_timestamp_ms if p.commit_timestamp_ms != -1 else now_ms
        offsets[tp] = OffsetRecord(p.committed_offset, p.committed_leader_epoch, metadata, commit_ms,
                                   expire_ms)
    return errors, offsets


# --- OffsetFetch ------------------------------------------------------------------------------------------
def handle_fetch_offsets(shard: GroupShard, req: OffsetFetchRequest) -> OffsetFetchResponse:
    error = shard.group_status_error(req.group_id, empty_id_ok=True)
    consumer_group = shard.consumer_groups.get(req.group_id)
    if error is None and consumer_group is not None:
        error = validate_offset_fetch(consumer_group, req.member_id, req.member_epoch)
    if error is not None:
        return OffsetFetchResponse(req.group_id, error)
    group = shard.groups.get(req.group_id)
    if group is not None and group.is_in(DEAD):
        group = None
    if req.topics is None:
        wanted = sorted(group.offsets) if group is not None else []
    else:
        wanted = list(dict.fromkeys((t.name, p) for t in req.topics for p in t.partition_indexes))
    by_topic: dict[str, list[OffsetFetchResponsePartition]] = {}
    for topic, partition in wanted:
        tp = (topic, partition)
        unstable = req.require_stable and group is not None and (
            group.has_pending_offset_commit(tp) or shard.transactional_offsets.has_pending(req.group_id, tp))
        by_topic.setdefault(topic, []).append(_fetch_one(group, tp, unstable))
    return OffsetFetchResponse(req.group_id, Errors.NONE,
                               [OffsetFetchResponseTopic(t, parts) for t, parts in by_topic.items()])


def _fetch_one(group: GroupMetadata | None, tp: TopicPartition, unstable: bool) -> OffsetFetchResponsePartition:
    if group is None:
        return OffsetFetchResponsePartition(tp[1])
    if unstable:  # require_stable and a commit (regular or transactional) of the partition not settled
        return OffsetFetchResponsePartition(tp[1], error_code=Errors.UNSTABLE_OFFSET_COMMIT)
    record = group.offsets.get(tp)
    if record is None:
        return OffsetFetchResponsePartition(tp[1])
    return OffsetFetchResponsePartition(tp[1], record.offset, record.leader_epoch, record.metadata)


# --- OffsetDelete (Kafka 3.9 handleDeleteOffsets) --------------------------------------------------------
def handle_delete_offsets(shard: GroupShard, req: OffsetDeleteRequest) -> Result[OffsetDeleteResponse]:
    """Deletes the listed offsets of an Empty group, or of a consumer group (classic protocol type or KIP-848) for
    topics it does not subscribe to; answered once the tombstones are written. A group-level error answers with no partitions."""
    wanted = list(dict.fromkeys((t.name, p) for t in req.topics for p in t.partition_indexes))
    error, subscribed = _offset_delete_check(shard, req.group_id, wanted)
    if error is not None:
        return Result(OffsetDeleteResponse(error))
    eligible = [tp for tp in wanted if tp not in subscribed]
    writes: list[Write] = []
    group = shard.groups.get(req.group_id)  # a consumer group's offsets, if it has any
    if eligible and group is not None:
        removed, writes = cleanup_groups(shard, [group], lambda g: remove_with_pending(shard, g, eligible),
                                         Removal.DELETED)
        log.info("event=offsets_deleted group=%s partitions=%d offsets_removed=%d",
                 req.group_id, len(eligible), removed)
    elif eligible:  # a consumer group with no offsets in memory: those whose tombstone is not acknowledged yet
        writes = unwritten_tombstones(shard, req.group_id, eligible)
    by_topic: dict[str, list[OffsetDeleteResponsePartition]] = {}
    for topic, partition in wanted:
        error_code = Errors.GROUP_SUBSCRIBED_TO_TOPIC if (topic, partition) in subscribed else Errors.NONE
        by_topic.setdefault(topic, []).append(OffsetDeleteResponsePartition(partition, error_code))
    response = OffsetDeleteResponse(Errors.NONE, [OffsetDeleteResponseTopic(t, ps) for t, ps in by_topic.items()])

    def respond(errors: list[Errors]) -> OffsetDeleteResponse:
        # tombstones Kafka refused: not reported deleted (owed and sent again; a crash before would undo them)
        failed = next((e for e in errors if e != Errors.NONE), None)
        return response if failed is None else OffsetDeleteResponse(kafka4_append_error(failed))

    return Result(response, writes, respond)


def _offset_delete_check(shard: GroupShard, group_id: str, wanted: list[TopicPartition]
                         ) -> tuple[Errors | None, set[TopicPartition]]:
    """The group error, else the partitions kept because the (non-empty, consumer) group subscribes to
    their topic. Unknown subscriptions count as subscribed to everything, as Kafka's isSubscribedToTopic."""
    error = shard.group_status_error(group_id)
    if error is not None:
        return error, set()
    consumer_group = shard.consumer_groups.get(group_id)
    if consumer_group is not None:  # KIP-848: any state; a topic subscribed by name or a resolved regex is kept
        subscribed_topics = consumer_group.subscribed_topic_names()
        return None, {tp for tp in wanted if tp[0] in subscribed_topics}
    group = shard.groups.get(group_id)
    if group is None or group.is_in(DEAD):
        return Errors.GROUP_ID_NOT_FOUND, set()
    if group.is_in(EMPTY):
        return None, set()
    if group.protocol_type != CONSUMER_PROTOCOL_TYPE:
        return Errors.NON_EMPTY_GROUP, set()
    topics = group.subscribed_topics
    return None, {tp for tp in wanted if topics is None or tp[0] in topics}


# --- expiry and cleanup (§7.3) ----------------------------------------------------------------------------
def expire_offsets(shard: GroupShard, slice_size: int = EXPIRY_SLICE) -> Iterator[tuple[int, int, list[Write]]]:
    """One run of Kafka's cleanup task over this shard (every offsets.retention.check.interval.ms): removes
    expired offsets, turns Empty groups without offsets Dead; yields the groups visited, the offsets removed
    and the tombstones of each slice of `slice_size` groups, so the caller can let the loop run between
    slices (a shard of thousands of groups would hold it for O(groups)). One timestamp for the whole run, as
    Kafka's; a group that left the shard, or a shard no longer active, between two slices is not touched."""
    now_ms, retention_ms = shard.now_wall_ms(), shard.config.offsets_retention_ms
    snapshot = list(shard.groups.values())
    for first in range(0, len(snapshot), slice_size):
        if shard.status is not ShardStatus.ACTIVE:
            return
        groups = [g for g in snapshot[first:first + slice_size] if shard.groups.get(g.group_id) is g]
        removed, writes = cleanup_groups(
            shard, groups, lambda g: g.remove_offsets(_expired_offsets(shard, g, now_ms, retention_ms)),
            Removal.EXPIRED)
        yield len(groups), removed, writes


def _expired_offsets(shard: GroupShard, group: GroupMetadata, now_ms: int, retention_ms: int) -> list[TopicPartition]:
    """A KIP-848 group's offsets expire by commit time, never those of topics its members subscribe to."""
    consumer_group = shard.consumer_groups.get(group.group_id)
    if consumer_group is None:
        expired = group.expired_offsets(now_ms, retention_ms)
    else:
        subscribed = {t for m in consumer_group.members.values() for t in consumer_group.effective_topics(m)}
        expired = group.expired_unsubscribed_offsets(now_ms, retention_ms, subscribed)
    pending = shard.transactional_offsets.pending_partitions(group.group_id)  # kept until their marker
    return [tp for tp in expired if tp not in pending]


def remove_with_pending(shard: GroupShard, group: GroupMetadata, partitions: list[TopicPartition]
                        ) -> list[TopicPartition]:
    """Kafka's deletion with open transactions: a partition gets a tombstone if the log may hold an offset of it
    (current, in flight, or of a failed write that may have landed) or a pending transactional one, and the
    tombstone drops them all (the transactions themselves stay open).

    A partition whose earlier tombstone of ours is not acknowledged yet (sent and unanswered, or failed and owed a
    retry) gets one again: memory forgot its offset, the log may still hold it, and a deletion answered without a
    write of its own would be answered before anything made it durable. Kafka's memory reverts a failed deletion
    (the next request finds the offsets and writes tombstones again), and a request that writes nothing is answered
    only once the writes still pending are (CoordinatorRuntime: waitForPendingWrites); this one's own tombstone
    is answered after those, in order."""
    partitions = list(dict.fromkeys(partitions))
    pending = shard.transactional_offsets.pending_partitions(group.group_id)
    unwritten = shard.unwritten_tombstones(group.group_id)
    removed = group.remove_offsets(partitions)
    removed += [tp for tp in partitions if (tp in pending or tp in unwritten) and tp not in removed]
    shard.transactional_offsets.drop_partitions(group.group_id, partitions)
    return removed


def unwritten_tombstones(shard: GroupShard, group_id: str, partitions: list[TopicPartition] | None = None
                         ) -> list[Write]:
    """A write of the tombstones of the group's offsets (of `partitions`, else all) whose earlier tombstone is not
    acknowledged yet, for a group that holds no offsets in memory (remove_with_pending says why), or none."""
    unwritten = shard.unwritten_tombstones(group_id)
    again = sorted(unwritten if partitions is None else (tp for tp in partitions if tp in unwritten))
    return [Write.tombstones(group_id, again, False)] if again else []


def cleanup_groups(shard: GroupShard, groups: list[GroupMetadata], selector: GroupSelector,
                   removal: Removal) -> tuple[int, list[Write]]:
    """Kafka's cleanupGroupMetadata: apply `selector` (returns removed partitions) to every group, retire
    Empty groups without offsets; returns the offsets removed and one tombstone write per group touched. All
    in-memory changes happen here, before any write, so no group is left Dead in memory by a slow, failing or
    cancelled write, and no group changes between its turn and ours."""
    writes = [w for w in (_cleanup_group(shard, group, selector, removal) for group in groups) if w is not None]
    removed = sum(1 for w in writes for r in w.records if isinstance(r, OffsetCommitRecord))
    return removed, writes


def _cleanup_group(shard: GroupShard, group: GroupMetadata, selector: GroupSelector,
                   removal: Removal) -> Write | None:
    removed: list[TopicPartition] = selector(group)
    # a group with open transactions stays, as Kafka's (their COMMIT would make offsets current)
    if group.is_in(EMPTY) and not group.has_offsets and not shard.transactional_offsets.has_open_transactions(
            group.group_id):
        group.transition_to(DEAD, shard.now_wall_ms())
    # As Kafka: the group tombstone only if this cleanup took the group out of the cache (an unloaded
    # group is someone else's) and the group ever had a generation (not a simple consumer's group).
    retired = group.is_in(DEAD) and shard.groups.get(group.group_id) is group
    if retired:
        del shard.groups[group.group_id]
        # offsets memory never took (their write failed) may be in the log all the same: they go with the group
        removed += group.remove_offsets(list(group.possibly_written))
        for member_id in group.pending_members:  # KIP-394 ids handed out: their expirations go too
            shard.heartbeat_purgatory.check_and_complete(member_key(group.group_id, member_id))
    write_group_tombstone = retired and group.generation_id > 0
    if removed or removal is Removal.GROUP_DELETED:
        _announce(shard.observer, removal, group.group_id, len(removed))
    if not removed and not write_group_tombstone:
        return None
    log.info("event=group_cleanup group=%s offsets_removed=%d group_tombstone=%s",
             group.group_id, len(removed), write_group_tombstone)
    group_id = group.group_id

    def written(error: Errors) -> None:
        if error != Errors.NONE:  # the store keeps them owed and sends them again (Kafka: acks=0, logged)
            log.warning("event=tombstone_write_failed group=%s offsets=%d error=%s", group_id, len(removed),
                        error.name)

    return Write.tombstones(group_id, removed, write_group_tombstone, written)
