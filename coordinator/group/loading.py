"""Replaying a loaded group's records into a group (§7.4): Stable with members, else Empty.

Loading hands a group's records (the latest of each key, as compaction keeps them) to `materialize_group`, the
one place a record becomes in-memory state; a new record type is replayed by adding its case here."""
from __future__ import annotations

from collections.abc import Iterable

from coordinator.group.api import JoinGroupProtocol
from coordinator.group.member import MemberMetadata
from coordinator.group.metadata import GroupMetadata
from coordinator.group.observer import GroupObserver
from coordinator.group.records import (GroupMetadataRecord, GroupRecord, OffsetCommitRecord, OffsetRecord, Record,
                                      TopicPartition)
from coordinator.group.state import GroupState


def materialize_group(group_id: str, records: Iterable[Record], now_ms: int, observer: GroupObserver
                      ) -> GroupMetadata:
    """The group `records` describe (tombstones delete what came before them); `now_ms`: the wall-clock time
    it is loaded at; `observer`: the group's."""
    record: GroupRecord | None = None
    offsets: dict[TopicPartition, OffsetRecord] = {}
    for replayed in records:
        if isinstance(replayed, GroupMetadataRecord):
            record = replayed.value
        elif not isinstance(replayed, OffsetCommitRecord):
            continue  # a consumer group's (KIP-848): replayed by the consumer groups, not here
        elif replayed.value is None:
            offsets.pop((replayed.topic, replayed.partition), None)
        else:
            offsets[(replayed.topic, replayed.partition)] = replayed.value
    return _group(group_id, record, offsets, now_ms, observer)


def _group(group_id: str, record: GroupRecord | None, offsets: dict[TopicPartition, OffsetRecord], now_ms: int,
           observer: GroupObserver) -> GroupMetadata:
    if record is None:  # offsets only: a "simple" group that never had members
        group = GroupMetadata(group_id, GroupState.EMPTY, now_ms, observer)
    else:
        state = GroupState.STABLE if record.members else GroupState.EMPTY
        group = GroupMetadata(group_id, state, now_ms, observer)
        group.protocol_type = record.protocol_type or None
        group.protocol_name = record.protocol
        group.generation_id = record.generation
        group.leader_id = record.leader  # set before members are added, so it is not re-elected
        ts = record.current_state_timestamp_ms
        group.current_state_timestamp_ms = None if ts < 0 else ts
        for m in record.members:
            protocols = [JoinGroupProtocol(record.protocol or "", m.subscription)]
            member = MemberMetadata(m.member_id, m.group_instance_id, m.client_id, m.client_host,
                                    m.rebalance_timeout_ms if m.rebalance_timeout_ms >= 0 else m.session_timeout_ms,
                                    m.session_timeout_ms, record.protocol_type, protocols)
            member.assignment = m.assignment
            group.add(member)
        if group.leader_id is None and group.members:
            group.leader_id = next(iter(group.members))
        group.subscribed_topics = group._compute_subscribed_topics()
    group.offsets.update(offsets)
    return group
