"""Replaying state-topic records (pure, no Kafka): latest wins, tombstones remove, unknown/malformed skipped;
the raw-error translation of failed appends; store records are the topic values."""

from __future__ import annotations

import logging

from confluent_kafka import KafkaError
from hypothesis import given
from hypothesis import strategies as st

from protocol.error_codes import Errors
from coordinator.group.records import GroupRecord, MemberRecord, OffsetRecord
from coordinator.storage.append_errors import append_error
from coordinator.storage.loader import StateReplay
from coordinator.storage.records import (
    GroupMetadataKey, OffsetCommitKey, decode_group_metadata_value, decode_offset_commit_value,
    encode_group_metadata_value, encode_key, encode_offset_commit_value, offset_commit_value_version,
)


def group_bytes(group_id: str, generation: int) -> tuple[bytes, bytes]:
    value = GroupRecord("consumer", generation, "range", None, -1, [])
    return encode_key(GroupMetadataKey(group_id)), encode_group_metadata_value(value)


def offset_bytes(group_id: str, partition: int, offset: int) -> tuple[bytes, bytes]:
    return (encode_key(OffsetCommitKey(group_id, "t", partition)),
            encode_offset_commit_value(OffsetRecord(offset, metadata="", commit_timestamp_ms=0)))


def test_latest_group_record_wins_and_tombstone_removes_it() -> None:
    replay = StateReplay()
    replay.apply(*group_bytes("a", 1))
    replay.apply(*group_bytes("a", 2))
    replay.apply(*group_bytes("b", 1))
    replay.apply(encode_key(GroupMetadataKey("b")), None)
    assert {g: v.generation for g, v in replay.state.groups.items()} == {"a": 2}


def test_offset_tombstone_removes_one_partition_and_empty_groups_disappear() -> None:
    replay = StateReplay()
    replay.apply(*offset_bytes("g", 0, 10))
    replay.apply(*offset_bytes("g", 1, 11))
    replay.apply(*offset_bytes("g", 0, 12))
    replay.apply(encode_key(OffsetCommitKey("g", "t", 1)), None)
    assert {tp: v.offset for tp, v in replay.state.offsets["g"].items()} == {("t", 0): 12}
    replay.apply(encode_key(OffsetCommitKey("g", "t", 0)), None)
    assert "g" not in replay.state.offsets
    replay.apply(encode_key(OffsetCommitKey("never", "t", 0)), None)  # tombstone of an unknown key: no-op
    assert replay.state.offsets == {}


def test_offsets_without_group_record_are_still_a_group() -> None:
    replay = StateReplay()
    replay.apply(*offset_bytes("simple", 0, 1))
    replay.apply(*group_bytes("classic", 1))
    assert sorted(replay.state.group_ids()) == ["classic", "simple"]


def test_consumer_group_records_are_kept_in_log_order() -> None:
    from coordinator.group.modern.records import GroupEpochRecord, RecordType, Tombstone
    from coordinator.storage import consumer_records

    replay = StateReplay()
    written = [GroupEpochRecord("g", 1), Tombstone(RecordType.GROUP_METADATA, "g"), GroupEpochRecord("g", 2)]
    for record in written:
        replay.apply(consumer_records.encode_key(record), consumer_records.encode_value(record))
    assert replay.state.consumer_records == written and replay.state.unknown_records == 0


def test_a_classic_record_is_placed_among_the_consumer_group_records_read_before_it() -> None:
    """Where the latest classic record of a group id was read (how many consumer group records came before it):
    a load that finds both types keeps the one written last (runtime `_one_type_per_group`)."""
    from coordinator.group.modern.records import GroupEpochRecord
    from coordinator.storage import consumer_records

    replay = StateReplay()
    epoch = GroupEpochRecord("g", 1)
    replay.apply(*group_bytes("g", 1))
    replay.apply(consumer_records.encode_key(epoch), consumer_records.encode_value(epoch))
    replay.apply(*group_bytes("g", 2))
    replay.apply(*group_bytes("gone", 1))
    replay.apply(encode_key(GroupMetadataKey("gone")), None)
    assert replay.state.classic_read_at == {"g": 1}


def test_unknown_key_versions_and_malformed_records_are_skipped_with_a_warning(caplog) -> None:
    replay = StateReplay()
    with caplog.at_level(logging.WARNING, logger="coordinator.storage"):
        replay.apply(b"\x00\x0a\x00\x01x", b"\x00\x00")  # Kafka 4.x share-group record (type 10)
        replay.apply(encode_key(GroupMetadataKey("bad")), b"\x00\x03\x00")  # truncated value
        replay.apply(None, b"")
        replay.apply(*group_bytes("ok", 3))
    assert (replay.state.unknown_records, replay.state.malformed_records, replay.state.records) == (1, 2, 4)
    assert set(replay.state.groups) == {"ok"}
    assert "unknown_key_version version=10" in caplog.text
    assert caplog.text.count("reason=malformed") == 2


@given(st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 2), st.none() | st.integers(0, 99)),
                max_size=40))
def test_replay_equals_applying_the_log_to_a_dict(log_entries) -> None:
    replay = StateReplay()
    expected: dict[tuple[str, int], int] = {}
    for group_id, partition, offset in log_entries:
        if offset is None:
            replay.apply(encode_key(OffsetCommitKey(group_id, "t", partition)), None)
            expected.pop((group_id, partition), None)
        else:
            replay.apply(*offset_bytes(group_id, partition, offset))
            expected[(group_id, partition)] = offset
    got = {(g, tp[1]): v.offset for g, offs in replay.state.offsets.items() for tp, v in offs.items()}
    assert got == expected


def test_append_errors_keep_broker_codes_and_translate_client_ones() -> None:
    assert append_error(KafkaError(KafkaError.NOT_ENOUGH_REPLICAS)) == Errors.NOT_ENOUGH_REPLICAS
    assert append_error(KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION)) == Errors.NOT_LEADER_OR_FOLLOWER
    assert append_error(KafkaError(KafkaError._MSG_TIMED_OUT)) == Errors.REQUEST_TIMED_OUT
    assert append_error(KafkaError(KafkaError._UNKNOWN_PARTITION)) == Errors.UNKNOWN_TOPIC_OR_PARTITION
    assert append_error(KafkaError(KafkaError._QUEUE_FULL)) == Errors.COORDINATOR_NOT_AVAILABLE
    assert append_error(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)) == Errors.TOPIC_AUTHORIZATION_FAILED
    assert append_error(KafkaError(KafkaError.INVALID_PRODUCER_EPOCH)) == Errors.UNKNOWN_SERVER_ERROR
    assert append_error(KafkaError(KafkaError._FENCED)) == Errors.NOT_COORDINATOR  # another instance owns it
    # the transactional producer's own state after an outage: nothing stored, the producer recovers, clients retry
    assert append_error(KafkaError(KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER)) == Errors.COORDINATOR_NOT_AVAILABLE
    assert append_error(KafkaError(KafkaError.UNKNOWN_PRODUCER_ID)) == Errors.COORDINATOR_NOT_AVAILABLE


def test_store_records_are_the_topic_values_and_come_back() -> None:
    # One record type between the core and the codec: what the core writes is what the codec decodes.
    member = MemberRecord("m", "inst", "c", "/h", 300_000, 10_000, b"sub", b"asg")
    record = GroupRecord("consumer", 4, "range", "m", 123, [member])
    assert decode_group_metadata_value(encode_group_metadata_value(record)) == record
    plain = OffsetRecord(5, leader_epoch=2, metadata="x", commit_timestamp_ms=9)
    assert offset_commit_value_version(plain) == 3  # no expire timestamp written (the v1 field stays unset)
    assert decode_offset_commit_value(encode_offset_commit_value(plain)) == plain
    expiring = OffsetRecord(5, metadata="x", commit_timestamp_ms=9, expire_timestamp_ms=99)
    assert decode_offset_commit_value(encode_offset_commit_value(expiring)) == expiring


def test_only_the_latest_group_value_is_decoded() -> None:
    replay = StateReplay()
    replay.apply(encode_key(GroupMetadataKey("g")), b"\x00\x03broken")  # superseded before it is ever decoded
    replay.apply(*group_bytes("g", 2))
    replay.apply(*group_bytes("h", 1))
    replay.apply(encode_key(GroupMetadataKey("h")), b"\x00\x03broken")  # the latest is broken: h is dropped
    state = replay.state
    assert {g: v.generation for g, v in state.groups.items()} == {"g": 2}
    assert state.malformed_records == 1


def test_group_tombstone_after_a_decoded_state_still_removes_the_group() -> None:
    replay = StateReplay()
    replay.apply(*group_bytes("g", 1))
    assert set(replay.state.groups) == {"g"}
    replay.apply(encode_key(GroupMetadataKey("g")), None)
    assert replay.state.groups == {}
