"""OffsetCommit (§3.5), OffsetFetch (§3.6), OffsetDelete and offset expiry (§7.3): mixed into GroupCoordinator."""
from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from coordinator.group.api import (UNKNOWN_MEMBER_ID, OffsetCommitRequest, OffsetCommitResponse,
                                   OffsetCommitResponsePartition, OffsetCommitResponseTopic, OffsetDeleteRequest,
                                   OffsetDeleteResponse, OffsetDeleteResponsePartition, OffsetDeleteResponseTopic,
                                   OffsetFetchRequest, OffsetFetchResponse, OffsetFetchResponsePartition,
                                   OffsetFetchResponseTopic)
from coordinator.group.delayed import member_key
from coordinator.group.errors import Errors, offset_append_error
from coordinator.group.metadata import CONSUMER_PROTOCOL_TYPE
from coordinator.group.state import GroupState
from coordinator.group.store import OffsetRecord, StoreError, TopicPartition

if TYPE_CHECKING:
    from coordinator.group.coordinator import GroupCoordinator
    from coordinator.group.metadata import GroupMetadata

log = logging.getLogger("coordinator.group")

EMPTY, PREPARING, COMPLETING, STABLE, DEAD = (
    GroupState.EMPTY, GroupState.PREPARING_REBALANCE, GroupState.COMPLETING_REBALANCE, GroupState.STABLE,
    GroupState.DEAD)


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


def _java_length(text: str) -> int:
    """Java's String.length(): UTF-16 code units, so a character outside the BMP counts twice."""
    return len(text) if text.isascii() else len(text.encode("utf-16-le")) // 2


class OffsetHandlers:
    # --- OffsetCommit -----------------------------------------------------------------------------------------
    async def commit_offsets(self: GroupCoordinator, req: OffsetCommitRequest) -> OffsetCommitResponse:
        error = self.group_status_error(req.group_id, empty_id_ok=True)
        if error is not None:
            return _commit_response(req, error)
        group = self.groups.get(req.group_id)
        if group is None:
            if req.generation_id >= 0:  # a commit from an older generation, or a deleted group
                return _commit_response(req, Errors.ILLEGAL_GENERATION)
            group = self.add_group(req.group_id)  # a "simple" consumer using Kafka for offsets only
        error = self._validate_offset_commit(group, req)
        if error is None and group.is_in(COMPLETING):
            error = Errors.REBALANCE_IN_PROGRESS
        if error is not None:
            return _commit_response(req, error)
        if group.state in (STABLE, PREPARING):
            member = group.get(req.member_id)
            self.schedule_heartbeat(group, member, member.session_timeout_ms)
        return _commit_response(req, await self._store_offsets(group, req))

    def _validate_offset_commit(self: GroupCoordinator, group: GroupMetadata, req: OffsetCommitRequest
                                ) -> Errors | None:
        if group.is_in(DEAD):
            return Errors.COORDINATOR_NOT_AVAILABLE
        if req.generation_id < 0 and group.is_in(EMPTY):
            return None
        if req.generation_id >= 0 or req.member_id != UNKNOWN_MEMBER_ID or req.group_instance_id is not None:
            error = self.validate_current_member(group, req.member_id, req.group_instance_id, "offset-commit")
            if error is None and req.generation_id != group.generation_id:
                error = Errors.ILLEGAL_GENERATION
            return error
        return Errors.UNKNOWN_MEMBER_ID  # generation -1 without a member: only for Empty groups

    async def _store_offsets(self: GroupCoordinator, group: GroupMetadata, req: OffsetCommitRequest
                             ) -> dict[TopicPartition, Errors]:
        errors, offsets = self._offset_records(req)
        if not offsets:
            return errors  # every partition's metadata was too large: answer at once
        self._offset_write_seq += 1
        version = self._offset_write_seq
        group.prepare_offset_commit(list(offsets))
        # The write and its bookkeeping run on their own: a cancelled request must not leave them half done.
        error = await asyncio.shield(self.spawn(self._write_and_cache_offsets(group, offsets, version)))
        if error == Errors.NONE:
            self.observer.on_offsets_committed(group.group_id, req.member_id, len(offsets))
        else:
            log.warning("event=offset_commit_failed group=%s member=%s partitions=%d error=%s",
                        group.group_id, req.member_id, len(offsets), error.name)
        errors.update(dict.fromkeys(offsets, error))
        return errors

    def _offset_records(self: GroupCoordinator, req: OffsetCommitRequest
                        ) -> tuple[dict[TopicPartition, Errors], dict[TopicPartition, OffsetRecord]]:
        now_ms = self.now_wall_ms()
        expire_ms = now_ms + req.retention_time_ms if req.retention_time_ms != -1 else None
        errors: dict[TopicPartition, Errors] = {}
        offsets: dict[TopicPartition, OffsetRecord] = {}
        latest = {(topic.name, p.partition_index): p for topic in req.topics for p in topic.partitions}
        for tp, p in latest.items():  # a partition given twice: the last one counts, as in Kafka's map
            metadata = p.committed_metadata or ""
            if _java_length(metadata) > self.config.offset_metadata_max_bytes:
                errors[tp] = Errors.OFFSET_METADATA_TOO_LARGE
                continue
            commit_ms = p.commit_timestamp_ms if p.commit_timestamp_ms != -1 else now_ms
            offsets[tp] = OffsetRecord(p.committed_offset, p.committed_leader_epoch, metadata, commit_ms,
                                       expire_ms)
        return errors, offsets

    async def _write_and_cache_offsets(self: GroupCoordinator, group: GroupMetadata,
                                       offsets: dict[TopicPartition, OffsetRecord], version: int) -> Errors:
        error = await self._write_offsets(group.group_id, offsets)
        group.finish_offset_commit(offsets, version, ok=error == Errors.NONE and not group.is_in(DEAD))
        return error

    async def _write_offsets(self: GroupCoordinator, group_id: str,
                             offsets: dict[TopicPartition, OffsetRecord]) -> Errors:
        try:
            await self.store.store_offsets(group_id, offsets)
            return Errors.NONE
        except StoreError as exc:
            return offset_append_error(exc.error)
        except Exception:
            log.exception("event=offset_store_failed group=%s", group_id)
            return Errors.UNKNOWN_SERVER_ERROR

    # --- OffsetFetch ------------------------------------------------------------------------------------------
    async def fetch_offsets(self: GroupCoordinator, req: OffsetFetchRequest) -> OffsetFetchResponse:
        return self.handle_fetch_offsets(req)

    def handle_fetch_offsets(self: GroupCoordinator, req: OffsetFetchRequest) -> OffsetFetchResponse:
        error = self.group_status_error(req.group_id, empty_id_ok=True)
        if error is not None:
            return OffsetFetchResponse(req.group_id, error)
        group = self.groups.get(req.group_id)
        if group is not None and group.is_in(DEAD):
            group = None
        if req.topics is None:
            wanted = sorted(group.offsets) if group is not None else []
        else:
            wanted = list(dict.fromkeys((t.name, p) for t in req.topics for p in t.partition_indexes))
        by_topic: dict[str, list[OffsetFetchResponsePartition]] = {}
        for topic, partition in wanted:
            by_topic.setdefault(topic, []).append(self._fetch_one(group, (topic, partition), req.require_stable))
        return OffsetFetchResponse(req.group_id, Errors.NONE,
                                   [OffsetFetchResponseTopic(t, parts) for t, parts in by_topic.items()])

    @staticmethod
    def _fetch_one(group: GroupMetadata | None, tp: TopicPartition, require_stable: bool
                   ) -> OffsetFetchResponsePartition:
        if group is None:
            return OffsetFetchResponsePartition(tp[1])
        if require_stable and group.has_pending_offset_commit(tp):
            return OffsetFetchResponsePartition(tp[1], error_code=Errors.UNSTABLE_OFFSET_COMMIT)
        record = group.offsets.get(tp)
        if record is None:
            return OffsetFetchResponsePartition(tp[1])
        return OffsetFetchResponsePartition(tp[1], record.offset, record.leader_epoch, record.metadata)

    # --- OffsetDelete (Kafka 3.9 handleDeleteOffsets) --------------------------------------------------------
    async def delete_offsets(self: GroupCoordinator, req: OffsetDeleteRequest) -> OffsetDeleteResponse:
        """Deletes the listed offsets of an Empty group, or of a consumer group for topics it does not
        subscribe to. A group-level error answers with no partitions at all."""
        wanted = list(dict.fromkeys((t.name, p) for t in req.topics for p in t.partition_indexes))
        error, subscribed = self._offset_delete_check(req.group_id, wanted)
        if error is not None:
            return OffsetDeleteResponse(error)
        eligible = [tp for tp in wanted if tp not in subscribed]
        if eligible:
            group = self.groups[req.group_id]
            removed = await self.cleanup_groups([group], lambda g: g.remove_offsets(eligible))
            log.info("event=offsets_deleted group=%s partitions=%d offsets_removed=%d",
                     req.group_id, len(eligible), removed)
        by_topic: dict[str, list[OffsetDeleteResponsePartition]] = {}
        for topic, partition in wanted:
            error_code = Errors.GROUP_SUBSCRIBED_TO_TOPIC if (topic, partition) in subscribed else Errors.NONE
            by_topic.setdefault(topic, []).append(OffsetDeleteResponsePartition(partition, error_code))
        return OffsetDeleteResponse(Errors.NONE, [OffsetDeleteResponseTopic(t, ps) for t, ps in by_topic.items()])

    def _offset_delete_check(self: GroupCoordinator, group_id: str, wanted: list[TopicPartition]
                             ) -> tuple[Errors | None, set[TopicPartition]]:
        """The group error, else the partitions kept because the (non-empty, consumer) group subscribes to
        their topic. Unknown subscriptions count as subscribed to everything, as Kafka's isSubscribedToTopic."""
        error = self.group_status_error(group_id)
        if error is not None:
            return error, set()
        group = self.groups.get(group_id)
        if group is None or group.is_in(DEAD):
            return Errors.GROUP_ID_NOT_FOUND, set()
        if group.is_in(EMPTY):
            return None, set()
        if group.protocol_type != CONSUMER_PROTOCOL_TYPE:
            return Errors.NON_EMPTY_GROUP, set()
        topics = group.subscribed_topics
        return None, {tp for tp in wanted if topics is None or tp[0] in topics}

    # --- expiry and cleanup (§7.3) ----------------------------------------------------------------------------
    async def expire_offsets(self: GroupCoordinator) -> int:
        """One run of Kafka's cleanup task (every offsets.retention.check.interval.ms): removes expired offsets,
        turns Empty groups without offsets Dead, and writes the tombstones. Returns the offsets removed."""
        if not self.is_active or self.is_loading:
            return 0
        now_ms, retention_ms = self.now_wall_ms(), self.config.offsets_retention_ms
        return await self.cleanup_groups(list(self.groups.values()),
                                         lambda g: g.remove_offsets(g.expired_offsets(now_ms, retention_ms)))

    async def cleanup_groups(self: GroupCoordinator, groups: list[GroupMetadata], selector) -> int:
        """Kafka's cleanupGroupMetadata: apply `selector` (returns removed partitions) to every group, retire
        Empty groups without offsets, then append the tombstones (fire-and-forget). All in-memory changes
        happen before the first write, so no group is left Dead in memory by a slow, failing or cancelled
        write, and no group changes between its turn and ours."""
        deletions = [d for d in (self._cleanup_group(group, selector) for group in groups) if d is not None]
        if deletions:
            await asyncio.shield(self.spawn(self._write_tombstones(deletions)))
        return sum(len(removed) for _, removed, _ in deletions)

    def _cleanup_group(self: GroupCoordinator, group: GroupMetadata, selector
                       ) -> tuple[str, list[TopicPartition], bool] | None:
        removed: list[TopicPartition] = selector(group)
        if group.is_in(EMPTY) and not group.has_offsets:
            group.transition_to(DEAD, self.now_wall_ms())
        # As Kafka: the group tombstone only if this cleanup took the group out of the cache (an unloaded
        # group is someone else's) and the group ever had a generation (not a simple consumer's group).
        retired = group.is_in(DEAD) and self.groups.get(group.group_id) is group
        if retired:
            del self.groups[group.group_id]
            for member_id in group.pending_members:  # KIP-394 ids handed out: their expirations go too
                self.heartbeat_purgatory.check_and_complete(member_key(group.group_id, member_id))
        write_group_tombstone = retired and group.generation_id > 0
        if removed:
            self.observer.on_offsets_expired(group.group_id, len(removed))
        if not removed and not write_group_tombstone:
            return None
        log.info("event=group_cleanup group=%s offsets_removed=%d group_tombstone=%s",
                 group.group_id, len(removed), write_group_tombstone)
        return group.group_id, removed, write_group_tombstone

    async def _write_tombstones(self: GroupCoordinator, deletions: list[tuple[str, list[TopicPartition], bool]]
                                ) -> None:
        for group_id, removed, write_group_tombstone in deletions:
            try:
                await self.store.delete_group(group_id, removed, write_group_tombstone)
            except Exception:  # Kafka logs and carries on (its tombstones are acks=0 anyway)
                log.exception("event=tombstone_write_failed group=%s offsets=%d", group_id, len(removed))
