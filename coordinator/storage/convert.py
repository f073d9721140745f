"""The group core's store records ↔ the state topic's record values (same fields, Kafka's encodings)."""

from __future__ import annotations

from coordinator.group.store import GroupRecord, MemberRecord, OffsetRecord
from coordinator.storage.records import GroupMetadataValue, MemberMetadataValue, OffsetCommitValue


def group_value(record: GroupRecord) -> GroupMetadataValue:
    members = tuple(
        MemberMetadataValue(member_id=m.member_id, client_id=m.client_id, client_host=m.client_host,
                            session_timeout_ms=m.session_timeout_ms, rebalance_timeout_ms=m.rebalance_timeout_ms,
                            subscription=bytes(m.subscription), assignment=bytes(m.assignment),
                            group_instance_id=m.group_instance_id)
        for m in record.members)
    return GroupMetadataValue(protocol_type=record.protocol_type, generation=record.generation,
                              protocol=record.protocol, leader=record.leader,
                              current_state_timestamp_ms=record.current_state_timestamp_ms, members=members)


def group_record(value: GroupMetadataValue) -> GroupRecord:
    members = [
        MemberRecord(member_id=m.member_id, group_instance_id=m.group_instance_id, client_id=m.client_id,
                     client_host=m.client_host, rebalance_timeout_ms=m.rebalance_timeout_ms,
                     session_timeout_ms=m.session_timeout_ms, subscription=m.subscription,
                     assignment=m.assignment)
        for m in value.members]
    return GroupRecord(protocol_type=value.protocol_type, generation=value.generation, protocol=value.protocol,
                       leader=value.leader, current_state_timestamp_ms=value.current_state_timestamp_ms,
                       members=members)


def offset_value(record: OffsetRecord) -> OffsetCommitValue:
    expire_ms = -1 if record.expire_timestamp_ms is None else record.expire_timestamp_ms
    return OffsetCommitValue(offset=record.offset, metadata=record.metadata,
                             commit_timestamp_ms=record.commit_timestamp_ms, leader_epoch=record.leader_epoch,
                             expire_timestamp_ms=expire_ms)


def offset_record(value: OffsetCommitValue) -> OffsetRecord:
    expire_ms = None if value.expire_timestamp_ms == -1 else value.expire_timestamp_ms
    return OffsetRecord(offset=value.offset, leader_epoch=value.leader_epoch, metadata=value.metadata,
                        commit_timestamp_ms=value.commit_timestamp_ms, expire_timestamp_ms=expire_ms)
